//! Benchmarks of the `rl` workspace.
