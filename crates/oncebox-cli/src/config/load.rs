//! Where the configuration comes from: defaults, the TOML file, the `ONCEBOX_…`
//! environment (with `…_FILE` secrets) and the flags, merged by figment.

use std::path::Path;

use figment::Figment;
use figment::providers::{Format, Toml};

use super::{Config, ConfigError, ENV_PREFIX, StoreUrl};

/// Flags that override the merged configuration (they win over everything).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// TOML configuration file.
    #[arg(long, short = 'c', global = true, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// `store.url`: sqlite://FILE, postgres://…, mysql://….
    #[arg(long, global = true, value_name = "URL")]
    pub store_url: Option<String>,
    /// `broker.url`: nats://…, amqp://…, kafka://HOST:PORT[,…], redis://….
    #[arg(long, global = true, value_name = "URL")]
    pub broker_url: Option<String>,
    /// `http.listen`: the metrics and health address, or `off`.
    #[arg(long, global = true, value_name = "ADDR")]
    pub listen: Option<String>,
}

impl Config {
    /// Merges defaults, the file, the environment and `flags`, then checks the result.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the key and the cause.
    pub fn load(flags: &Overrides) -> Result<Self, ConfigError> {
        let vars: Vec<(String, String)> = std::env::vars().collect();
        Self::load_from(flags, &vars)
    }

    /// [`load`](Self::load) with the environment given (tests).
    pub(crate) fn load_from(
        flags: &Overrides,
        vars: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::new();
        if let Some(path) = &flags.config {
            if !path.is_file() {
                return Err(ConfigError::key(
                    "--config",
                    format!("{} is not a readable file", path.display()),
                ));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        Self::extract(figment, flags, vars)
    }

    /// [`load_from`](Self::load_from) with the file's text given instead of its path (the
    /// fuzz targets, which write no files).
    #[cfg(any(test, fuzzing))]
    pub(crate) fn load_from_text(
        text: &str,
        vars: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let figment = Figment::new().merge(Toml::string(text));
        Self::extract(figment, &Overrides::default(), vars)
    }

    /// Merges the environment and `flags` over `figment` (defaults and the file), then
    /// checks the result.
    fn extract(
        figment: Figment,
        flags: &Overrides,
        vars: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let figment = figment.merge(Environment::read(vars)?);
        let mut config: Config = figment
            .extract_lossy()
            .map_err(|error| from_figment(&error))?;
        config.apply(flags)?;
        config.validate()?;
        Ok(config)
    }

    fn apply(&mut self, flags: &Overrides) -> Result<(), ConfigError> {
        if let Some(url) = &flags.store_url {
            self.store.url =
                Some(StoreUrl::parse(url).map_err(|e| ConfigError::key("--store-url", e))?);
        }
        if let Some(url) = &flags.broker_url {
            self.broker.url = Some(url.clone());
        }
        if let Some(listen) = &flags.listen {
            self.http.listen.clone_from(listen);
        }
        Ok(())
    }
}

/// The keys whose value may come from a file named by a `…_FILE` variable.
const SECRETS: [&str; 4] = [
    "store.password",
    "broker.password",
    "dashboard.token",
    "dashboard.redis_dedup_url",
];

/// Where a value from the environment came from, for error messages.
const FROM_ENVIRONMENT: &str = "the environment";

/// The `ONCEBOX_SECTION__KEY` variables, and the secrets of `…_FILE` variables, as one
/// source of configuration. Values stay text: the extraction reads `"256"` as the
/// number a key wants and `"42"` as the name another wants.
struct Environment(figment::value::Dict);

impl Environment {
    fn read(vars: &[(String, String)]) -> Result<Self, ConfigError> {
        let mut tree = figment::value::Dict::new();
        let mut from_files = Vec::new();
        for (name, value) in vars {
            let Some(key) = env_key(name) else { continue };
            match key.strip_suffix("_file") {
                Some(secret) if SECRETS.contains(&secret) => {
                    let content = std::fs::read_to_string(Path::new(value)).map_err(|error| {
                        ConfigError::key(name, format!("cannot read {value}: {error}"))
                    })?;
                    let content = content.strip_suffix('\n').unwrap_or(&content);
                    let content = content.strip_suffix('\r').unwrap_or(content);
                    from_files.push(secret.to_owned());
                    insert_path(&mut tree, secret, content.to_owned().into());
                }
                Some(_) if !SECRETS.contains(&key.as_str()) => {
                    return Err(ConfigError::key(
                        name,
                        format!("only secrets are read from files ({})", SECRETS.join(", ")),
                    ));
                }
                _ => {
                    if from_files.contains(&key)
                        || vars
                            .iter()
                            .any(|(other, _)| *other == format!("{name}_FILE"))
                    {
                        return Err(ConfigError::key(
                            name,
                            format!("set twice: by {name} and by {name}_FILE; keep one"),
                        ));
                    }
                    insert_path(&mut tree, &key, value.clone().into());
                }
            }
        }
        Ok(Self(tree))
    }
}

impl figment::Provider for Environment {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named(FROM_ENVIRONMENT)
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        Ok(figment::Profile::Default.collect(self.0.clone()))
    }
}

/// `store.url` from `ONCEBOX_STORE__URL`; `None` for other variables. Section and key
/// are lower-cased: `[topics]` names set from the environment are lower case.
fn env_key(name: &str) -> Option<String> {
    let rest = name.strip_prefix(ENV_PREFIX)?;
    let (section, key) = rest.split_once("__")?;
    if section.is_empty() || key.is_empty() {
        return None;
    }
    Some(format!("{}.{}", section.to_lowercase(), key.to_lowercase()))
}

fn insert_path(tree: &mut figment::value::Dict, key: &str, value: figment::value::Value) {
    use figment::value::{Dict, Value};
    let Some((section, field)) = key.split_once('.') else {
        tree.insert(key.to_owned(), value);
        return;
    };
    let entry = tree
        .entry(section.to_owned())
        .or_insert_with(|| Value::from(Dict::new()));
    if let Value::Dict(_, dict) = entry {
        dict.insert(field.to_owned(), value);
    }
}

/// One line from figment's error: the key, what was wrong, where it came from (the
/// file, or the variable that set it).
fn from_figment(error: &figment::Error) -> ConfigError {
    let key = if error.path.is_empty() {
        "configuration".to_owned()
    } else {
        error.path.join(".")
    };
    let source = match &error.metadata {
        Some(metadata) if metadata.name == FROM_ENVIRONMENT => format!(
            " (from {ENV_PREFIX}{})",
            error.path.join("__").to_uppercase()
        ),
        Some(metadata) => match &metadata.source {
            Some(source) => format!(" (in {source})"),
            None => format!(" (in {})", metadata.name),
        },
        None => String::new(),
    };
    ConfigError(format!("{key}: {}{source}", error.kind))
}
