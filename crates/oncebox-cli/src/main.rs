//! The `oncebox` command. It lives in the library `oncebox_cli`, where its documentation
//! is.

fn main() -> std::process::ExitCode {
    oncebox_cli::main()
}
