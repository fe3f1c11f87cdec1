//! Symbolization of normalized addresses with blazesym.
