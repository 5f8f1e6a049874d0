//! Entry points for the fuzz targets in `fuzz/` at the repository root. Compiled only
//! with `--cfg fuzzing`, which `cargo fuzz` sets; not part of the crate's API.

use crate::config::Config;

/// Loads a configuration from the text of a TOML file and the `ONCEBOX_…` environment
/// `vars` as `oncebox config check` does, and prints it as that command does.
///
/// # Errors
///
/// The configuration error, as the command reports it.
pub fn check_config(toml: &str, vars: &[(String, String)]) -> Result<String, String> {
    Config::load_from_text(toml, vars)
        .map(|config| config.to_toml())
        .map_err(|error| error.to_string())
}
