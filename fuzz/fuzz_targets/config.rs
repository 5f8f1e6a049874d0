//! The service's configuration file as `oncebox config check` reads it: TOML text
//! (figment), merged with `ONCEBOX_…` environment variables, then checked.
//!
//! The input is the file's text, then after a NUL byte the environment, one
//! `NAME=value` a line (names ending in `_FILE`, which name files to read, are left
//! out).
//!
//! Checks: nothing panics; a configuration that loads is printed, and the printed
//! configuration loads again to the same print.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncebox_cli::fuzzing::check_config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (toml, environment) = text.split_once('\0').unwrap_or((text, ""));
    let vars: Vec<(String, String)> = environment
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(name, _)| !name.ends_with("_FILE"))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    let Ok(printed) = check_config(toml, &vars) else {
        return;
    };
    let again = check_config(&printed, &[])
        .unwrap_or_else(|error| panic!("the printed configuration does not load: {error}"));
    assert_eq!(again, printed);
});
