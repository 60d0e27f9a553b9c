//! Examples of the `rl` workspace.
