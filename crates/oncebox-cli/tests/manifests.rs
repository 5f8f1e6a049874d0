//! The deployment files of `deploy/kubernetes` and `deploy/systemd` against the binary
//! they run: the files parse; each pod's configuration (the ConfigMap with the pod's
//! environment, its `…_FILE` secrets read from the Secret it mounts) is one
//! `oncebox config check` accepts; every probe names a port the container declares
//! and the configuration listens on, and a path a live process answers with 200; grace
//! periods exceed the configured stop deadlines; secrets come only from `_FILE` mounts.
//! The systemd units pass `systemd-analyze verify` and stop later than the binary's
//! deadline.

mod deploy_files;
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use yaml_rust2::Yaml;

const DIR: &str = "deploy/kubernetes";

/// Every document of every manifest, with its file.
fn manifests() -> Vec<(String, Yaml)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_files::root().join(DIR))
        .expect("deploy/kubernetes")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let mut docs = Vec::new();
    for path in files {
        let name = format!(
            "{DIR}/{}",
            path.file_name().expect("a name").to_string_lossy()
        );
        for doc in deploy_files::yaml(&name) {
            for key in ["apiVersion", "kind"] {
                assert!(
                    doc[key].as_str().is_some(),
                    "{name}: a document without {key}"
                );
            }
            assert!(
                doc["metadata"]["name"].as_str().is_some(),
                "{name}: a document without a name"
            );
            docs.push((name.clone(), doc));
        }
    }
    docs
}

fn find<'a>(docs: &'a [(String, Yaml)], kind: &str, name: &str) -> &'a Yaml {
    docs.iter()
        .map(|(_, doc)| doc)
        .find(|doc| {
            doc["kind"].as_str() == Some(kind) && doc["metadata"]["name"].as_str() == Some(name)
        })
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn list(yaml: &Yaml) -> &[Yaml] {
    yaml.as_vec().map_or(&[], Vec::as_slice)
}

/// Names of the secret settings, as variables: set only through `…_FILE`.
const SECRET_VARIABLES: &[&str] = &[
    "ONCEBOX_STORE__PASSWORD",
    "ONCEBOX_BROKER__PASSWORD",
    "ONCEBOX_DASHBOARD__TOKEN",
    "ONCEBOX_DASHBOARD__REDIS_DEDUP_URL",
];

/// A pod's container as the test runs it here: its arguments, and its environment with
/// each `…_FILE` variable pointed at a local copy of the Secret's item it names.
struct Pod {
    name: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    /// The container's ports by name.
    ports: BTreeMap<String, i64>,
    probes: Vec<(String, String, Yaml)>,
    grace: i64,
}

/// Reads the Deployment `name`'s only container, checks where its secrets come from,
/// and writes its secrets and the ConfigMap under `dir`.
fn pod(docs: &[(String, Yaml)], name: &str, dir: &Path) -> Pod {
    let deployment = find(docs, "Deployment", name);
    let spec = &deployment["spec"]["template"]["spec"];
    let containers = list(&spec["containers"]);
    assert_eq!(containers.len(), 1, "{name}: one container");
    let container = &containers[0];
    assert_eq!(
        spec["containers"][0]["name"].as_str(),
        Some(name),
        "{name}: the container is named as the Deployment (the stop alert matches it)"
    );
    let config_map = find(docs, "ConfigMap", "oncebox");
    let secret = find(docs, "Secret", "oncebox");

    // Mounts: which directory holds which Secret items or the ConfigMap.
    let volumes = list(&spec["volumes"]);
    let mut secret_dirs: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut config_dir = None;
    for mount in list(&container["volumeMounts"]) {
        let path = mount["mountPath"].as_str().expect("a mountPath").to_owned();
        let volume = volumes
            .iter()
            .find(|volume| volume["name"] == mount["name"])
            .unwrap_or_else(|| panic!("{name}: no volume {:?}", mount["name"]));
        if volume["configMap"]["name"].as_str() == Some("oncebox") {
            config_dir = Some(path);
        } else if let Some(secret_name) = volume["secret"]["secretName"].as_str() {
            assert_eq!(secret_name, "oncebox");
            let items = list(&volume["secret"]["items"])
                .iter()
                .map(|item| {
                    (
                        item["path"].as_str().expect("a path").to_owned(),
                        item["key"].as_str().expect("a key").to_owned(),
                    )
                })
                .collect();
            secret_dirs.insert(path, items);
        }
    }
    let config_dir = config_dir.unwrap_or_else(|| panic!("{name}: the ConfigMap is not mounted"));
    let local_config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &local_config,
        config_map["data"]["oncebox.toml"]
            .as_str()
            .expect("oncebox.toml"),
    )
    .expect("the config is written");

    let mut args: Vec<String> = list(&container["args"])
        .iter()
        .map(|arg| arg.as_str().expect("a string").to_owned())
        .collect();
    let at = args
        .iter()
        .position(|arg| arg == "--config")
        .expect("--config");
    assert_eq!(
        args[at + 1],
        format!("{config_dir}/oncebox.toml"),
        "{name}: the mounted file"
    );
    args[at + 1] = local_config.display().to_string();

    let mut env = BTreeMap::new();
    for variable in list(&container["env"]) {
        let key = variable["name"].as_str().expect("a name").to_owned();
        assert!(
            variable["valueFrom"].is_badvalue(),
            "{name}: {key} comes from valueFrom; secrets come from files (…_FILE)"
        );
        assert!(
            !SECRET_VARIABLES.contains(&key.as_str()),
            "{name}: {key} is a secret in the environment; use {key}_FILE"
        );
        let value = variable["value"].as_str().expect("a value").to_owned();
        let value = match key.strip_suffix("_FILE") {
            Some(secret_key) => {
                assert!(SECRET_VARIABLES.contains(&secret_key), "{name}: {key}");
                let (mount, items) = secret_dirs
                    .iter()
                    .find(|(mount, _)| value.starts_with(&format!("{mount}/")))
                    .unwrap_or_else(|| panic!("{name}: {key} = {value} is in no Secret mount"));
                let item = &value[mount.len() + 1..];
                let item_key = items
                    .get(item)
                    .unwrap_or_else(|| panic!("{name}: the mount has no {item}"));
                let content = secret["stringData"][item_key.as_str()]
                    .as_str()
                    .unwrap_or_else(|| panic!("the Secret has no {item_key}"));
                let local = dir.join(format!("{name}-{item}"));
                std::fs::write(&local, content).expect("the secret is written");
                local.display().to_string()
            }
            None => value,
        };
        env.insert(key, value);
    }
    let ports = list(&container["ports"])
        .iter()
        .map(|port| {
            (
                port["name"].as_str().expect("a named port").to_owned(),
                port["containerPort"].as_i64().expect("a port"),
            )
        })
        .collect();
    let probes = ["livenessProbe", "readinessProbe", "startupProbe"]
        .iter()
        .filter(|probe| !container[**probe].is_badvalue())
        .map(|probe| {
            let get = &container[*probe]["httpGet"];
            (
                (*probe).to_owned(),
                get["path"]
                    .as_str()
                    .expect("an httpGet probe with a path")
                    .to_owned(),
                get["port"].clone(),
            )
        })
        .collect();
    Pod {
        name: name.to_owned(),
        args,
        env,
        ports,
        probes,
        grace: spec["terminationGracePeriodSeconds"].as_i64().unwrap_or(30),
    }
}

impl Pod {
    /// The merged configuration the pod runs on, by `oncebox config check`.
    fn config(&self) -> toml::Table {
        let config_at = self
            .args
            .iter()
            .position(|arg| arg == "--config")
            .expect("--config");
        let out = support::oncebox()
            .args(&self.args[..config_at + 2])
            .args(["config", "check"])
            .envs(&self.env)
            .output()
            .expect("oncebox runs");
        assert!(
            out.status.success(),
            "{}: config check refused the pod's configuration: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        toml::from_str(&String::from_utf8_lossy(&out.stdout)).expect("TOML")
    }

    /// The port a probe names (by name or number).
    fn probe_port(&self, port: &Yaml) -> i64 {
        match port {
            Yaml::String(name) => *self
                .ports
                .get(name)
                .unwrap_or_else(|| panic!("{}: no port named {name}", self.name)),
            Yaml::Integer(number) => *number,
            other => panic!("{}: a probe's port {other:?}", self.name),
        }
    }

    /// Starts the pod's command here, on the local services: `overrides` (the store,
    /// the broker, a schema of its own) and the listen address on `port`.
    fn start(&self, overrides: &[(&str, String)], listen: (&str, u16), log: &Path) -> Running {
        let (listen_key, port) = listen;
        let child = support::oncebox()
            .args(&self.args)
            .envs(&self.env)
            .envs(overrides.iter().map(|(key, value)| (*key, value.as_str())))
            .env(listen_key, format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("a log"))
            .spawn()
            .expect("oncebox starts");
        Running(child)
    }
}

/// A process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn seconds(config: &toml::Table, section: &str, key: &str) -> u64 {
    let text = config[section][key].as_str().expect("a duration");
    humantime::parse_duration(text)
        .unwrap_or_else(|error| panic!("{section}.{key} = {text}: {error}"))
        .as_secs()
}

fn listen_port(config: &toml::Table, section: &str) -> i64 {
    let listen = config[section]["listen"].as_str().expect("listen");
    listen
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("{section}.listen = {listen}"))
}

#[test]
fn the_kubernetes_manifests_fit_the_binary() {
    let docs = manifests();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("manifests");
    let _cleanup =
        support::LogTailingCleanup::new(&schema).with_redis_key(format!("{schema}:orders"));
    // The local services in place of the cluster's, a schema and a slot of the test's.
    let overrides = [
        ("ONCEBOX_STORE__URL", support::pg_url()),
        ("ONCEBOX_STORE__SCHEMA", schema.clone()),
        ("ONCEBOX_BROKER__URL", support::redis_url()),
        ("ONCEBOX_BROKER__KEY_PREFIX", format!("{schema}:")),
        ("ONCEBOX_CDC__SLOT", schema.clone()),
    ];

    // The polling relay: several replicas, a budget that keeps most of them.
    let relay = find(&docs, "Deployment", "oncebox-relay");
    assert!(
        relay["spec"]["replicas"].as_i64().unwrap_or(1) >= 2,
        "several polling relays"
    );
    // The log-tailing relay: one reads, one stands by.
    let cdc = find(&docs, "Deployment", "oncebox-relay-cdc");
    assert_eq!(
        cdc["spec"]["replicas"].as_i64(),
        Some(2),
        "a reader and a standby"
    );
    for name in ["oncebox-relay", "oncebox-relay-cdc", "oncebox-receive"] {
        let budget = find(&docs, "PodDisruptionBudget", name);
        let labels = &find(&docs, "Deployment", name)["spec"]["template"]["metadata"]["labels"];
        for (key, value) in budget["spec"]["selector"]["matchLabels"]
            .as_hash()
            .expect("matchLabels")
        {
            assert_eq!(
                &labels[key.as_str().expect("a key")],
                value,
                "{name}: the budget selects its pods"
            );
        }
        assert!(
            !budget["spec"]["maxUnavailable"].is_badvalue()
                || !budget["spec"]["minAvailable"].is_badvalue()
        );
    }

    let mut migrated = false;
    for (name, command, stop_section) in [
        ("oncebox-relay", "relay", Some("relay")),
        ("oncebox-relay-cdc", "relay", Some("relay")),
        ("oncebox-receive", "receive", Some("receive")),
        ("oncebox-dashboard", "dashboard", None),
    ] {
        let pod = pod(&docs, name, dir.path());
        assert_eq!(pod.args.last().map(String::as_str), Some(command), "{name}");
        let config = pod.config();
        if name == "oncebox-relay-cdc" {
            assert_eq!(config["relay"]["mode"].as_str(), Some("cdc"), "{name}");
        }
        if let Some(section) = stop_section {
            let stop = seconds(&config, section, "stop_timeout");
            assert!(
                u64::try_from(pod.grace).expect("positive") > stop,
                "{name}: terminationGracePeriodSeconds {} is not above {section}.stop_timeout {stop}s",
                pod.grace
            );
        }
        // The port the configuration listens on is the probes' port.
        let (listen_section, listen_key) = if command == "dashboard" {
            ("dashboard", "ONCEBOX_DASHBOARD__LISTEN")
        } else {
            ("http", "ONCEBOX_HTTP__LISTEN")
        };
        let listen = listen_port(&config, listen_section);
        assert!(!pod.probes.is_empty(), "{name}: no probe");
        for (probe, _, port) in &pod.probes {
            assert_eq!(
                pod.probe_port(port),
                listen,
                "{name}: {probe} on {listen_section}.listen's port"
            );
        }
        let paths: Vec<&str> = pod
            .probes
            .iter()
            .map(|(_, path, _)| path.as_str())
            .collect();
        if command != "dashboard" {
            assert!(
                paths.contains(&"/healthz") && paths.contains(&"/readyz"),
                "{name}: {paths:?}"
            );
        }

        // A live run: each probe's path answers 200 on the listen port.
        if !migrated {
            let out = support::oncebox()
                .args(&pod.args[..pod.args.len() - 1])
                .arg("migrate")
                .envs(&pod.env)
                .envs(overrides.iter().map(|(key, value)| (*key, value.as_str())))
                .output()
                .expect("oncebox runs");
            assert!(
                out.status.success(),
                "migrate: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            migrated = true;
        }
        let port = support::free_port();
        let log = dir.path().join(format!("{name}.log"));
        let _running = pod.start(&overrides, (listen_key, port), &log);
        for (probe, path, _) in &pod.probes {
            support::wait_for(
                &format!("{name}: {probe} {path} to answer 200"),
                Duration::from_secs(60),
                || {
                    (support::http_get(port, path).map(|(status, _)| status) == Some(200))
                        .then_some(())
                },
            );
        }
    }

    // The dashboard's Service reaches its pods on the dashboard's port.
    let service = find(&docs, "Service", "oncebox-dashboard");
    let labels =
        &find(&docs, "Deployment", "oncebox-dashboard")["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_hash().expect("a selector") {
        assert_eq!(&labels[key.as_str().expect("a key")], value);
    }
    let dashboard = pod(&docs, "oncebox-dashboard", dir.path());
    for port in list(&service["spec"]["ports"]) {
        assert_eq!(
            dashboard.probe_port(&port["targetPort"]),
            listen_port(&dashboard.config(), "dashboard")
        );
    }
}

/// The systemd units pass `systemd-analyze verify` (with this build's binary in place
/// of /usr/local/bin/oncebox), systemd's stop timeout is above the binary's deadline,
/// and the store's password comes from a credential through `…_FILE`.
#[test]
fn the_systemd_units_verify_and_stop_after_the_binary() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = support::write_config(
        dir.path(),
        "oncebox.toml",
        "[store]\nurl = \"sqlite://x.db\"\n[broker]\nurl = \"redis://127.0.0.1:6379\"\n",
    );
    let out = support::run(&config, &["config", "check"]);
    assert!(out.status.success());
    let defaults: toml::Table =
        toml::from_str(&String::from_utf8_lossy(&out.stdout)).expect("TOML");
    for (unit, command, section) in [
        ("oncebox-relay.service", "relay", "relay"),
        ("oncebox-receive.service", "receive", "receive"),
    ] {
        let text = deploy_files::read(&format!("deploy/systemd/{unit}"));
        let value = |key: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{unit}: no {key}="))
                .to_owned()
        };
        assert!(
            value("ExecStart").ends_with(&format!(
                "oncebox --config /etc/oncebox/oncebox.toml {command}"
            )),
            "{unit}"
        );
        let stop = humantime::parse_duration(&value("TimeoutStopSec")).expect("a duration");
        assert!(
            stop.as_secs() > seconds(&defaults, section, "stop_timeout"),
            "{unit}: TimeoutStopSec is not above the default {section}.stop_timeout"
        );
        assert_eq!(value("KillSignal"), "SIGTERM");
        assert_eq!(
            value("Environment"),
            "ONCEBOX_STORE__PASSWORD_FILE=%d/store-password",
            "{unit}: the password from the credential"
        );
        assert!(value("LoadCredential").starts_with("store-password:"));
        for variable in SECRET_VARIABLES {
            assert!(
                !text.contains(&format!("{variable}=")),
                "{unit}: {variable} set in the unit"
            );
        }
        let local = dir.path().join(unit);
        std::fs::write(
            &local,
            text.replace("/usr/local/bin/oncebox", env!("CARGO_BIN_EXE_oncebox")),
        )
        .expect("the unit is written");
        let out = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(&local)
            .output()
            .expect("systemd-analyze runs (scripts/services.sh ops-tools installs it)");
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{unit}: systemd-analyze verify: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
