//! Integration tests of the `rl` workspace.
