//! One module per subcommand; each exposes an `Args` struct and a `run` function.
