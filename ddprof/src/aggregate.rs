//! Folds samples per upload period into (process, thread, stack) counts.
