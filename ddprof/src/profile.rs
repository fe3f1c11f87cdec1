//! pprof encoding of aggregated, symbolized profiles.
