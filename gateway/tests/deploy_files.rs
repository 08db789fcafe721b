//! The deployment files against the binaries, which are the one source of defaults:
//!
//! - every environment variable compose.yaml sets on `gateway`, `worker` and `worker-local` is a
//!   flag of that service's binary (clap `env = ...`), with a value the binary accepts;
//! - every flag of the binary is set there, except those in [`LEFT_TO_THE_BINARY`] (each with its
//!   reason), so a user tunes every setting from .env;
//! - where such a variable is `${NAME:-default}`, the default is the binary's own default (a
//!   deployment fact such as a path inside the image is listed in [`DEPLOYMENT_DEFAULTS`]); a flag
//!   without a default is passed through (`NAME:` with no value: set only when .env sets it);
//! - .env.example lists every `${NAME:-default}` and pass-through of compose.yaml, commented out,
//!   with that default (empty for a pass-through), and nothing else;
//! - JetStream's store is on a named volume of the nats service, and the TEI images are the TEI
//!   release the gateway mirrors ([`TEI_MINOR`]);
//! - the gateway waits for the workers' health checks, so it takes traffic only once a worker can
//!   answer.
//!
//! No Docker needed: compose.yaml is read as YAML (anchors and `<<` merge keys resolved here, as
//! Compose does). `scripts/compose-check.sh` renders it with `docker compose config` as well.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::Path;

use clap::{Command, CommandFactory, FromArgMatches};
use yaml_rust2::{Yaml, YamlLoader};

/// Read by the binaries but not clap flags.
const NOT_FLAGS: &[&str] = &["RUST_LOG"];

/// Flags whose compose default deliberately differs from the binary's: (variable, default, why).
const DEPLOYMENT_DEFAULTS: &[(&str, &str, &str)] = &[(
    "MODEL_DIR",
    "/app/models/all-MiniLM-L6-v2",
    "the model's path inside the worker-local image",
)];

/// Compose's own variables, which .env.example may set although compose.yaml doesn't read them.
const COMPOSE_VARIABLES: &[&str] = &["COMPOSE_PROFILES"];

/// Flags compose.yaml deliberately does not set on a service: (service or `*` for all three,
/// variable, why).
/// The stack's workers use TEI or the built-in model; an OpenAI-compatible upstream excludes
/// both (the worker refuses OPENAI_URL beside TEI_URL), so its settings are the operator's.
const OPENAI_UPSTREAM: &str =
    "compose runs TEI or the built-in model, not an OpenAI-compatible upstream";

const LEFT_TO_THE_BINARY: &[(&str, &str, &str)] = &[
    ("worker", "OPENAI_URL", OPENAI_UPSTREAM),
    ("worker", "OPENAI_MODEL", OPENAI_UPSTREAM),
    ("worker", "OPENAI_API_KEY", OPENAI_UPSTREAM),
    ("worker", "OPENAI_MAX_INPUTS", OPENAI_UPSTREAM),
    ("worker", "OPENAI_MAX_INPUT_TOKENS", OPENAI_UPSTREAM),
    ("worker-local", "OPENAI_URL", OPENAI_UPSTREAM),
    ("worker-local", "OPENAI_MODEL", OPENAI_UPSTREAM),
    ("worker-local", "OPENAI_API_KEY", OPENAI_UPSTREAM),
    ("worker-local", "OPENAI_MAX_INPUTS", OPENAI_UPSTREAM),
    ("worker-local", "OPENAI_MAX_INPUT_TOKENS", OPENAI_UPSTREAM),
    ("*", "NATS_CREDS", NATS_PLAIN),
    ("*", "NATS_NKEY", NATS_PLAIN),
    ("*", "NATS_USER", NATS_PLAIN),
    ("*", "NATS_PASSWORD", NATS_PLAIN),
    ("*", "NATS_TOKEN", NATS_PLAIN),
    ("*", "NATS_TLS_CA", NATS_PLAIN),
    ("*", "NATS_TLS_CERT", NATS_PLAIN),
    ("*", "NATS_TLS_KEY", NATS_PLAIN),
    ("worker", "MODEL_DIR", "TEI-backed workers load no model"),
    (
        "worker",
        "MODEL_ID",
        "TEI-backed workers load no model; TEI's MODEL_ID picks it",
    ),
    (
        "worker-local",
        "MODEL_ID",
        "the model is baked into the image (MODEL_DIR); a hub id would download another at start",
    ),
    ("worker-local", "TEI_URL", "the local profile has no TEI"),
    (
        "worker-local",
        "TEI_API_KEY",
        "the local profile has no TEI",
    ),
    ("worker-local", "TEI_TLS_CA", "the local profile has no TEI"),
    (
        "worker",
        "TEI_API_KEY",
        "compose's TEI runs on the compose network without a key",
    ),
    (
        "worker",
        "TEI_TLS_CA",
        "compose's TEI is plain HTTP on the compose network",
    ),
    (
        "worker",
        "TOKENIZER",
        "the worker finds the tokenizer of the model TEI's /info names (Hugging Face cache or hub)",
    ),
    (
        "worker-local",
        "TOKENIZER",
        "the built-in model counts tokens with its own tokenizer",
    ),
];

const NATS_PLAIN: &str = "compose's nats (nats/nats.conf) has no auth and no TLS: it is reachable only on the compose network";

/// The TEI release line the gateway's API mirrors (TEI 1.9.3, gateway/src/openapi.rs): the TEI
/// images' default tags must be of it.
const TEI_MINOR: &str = "1.9";

fn repo_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A YAML node with every `<<` merge key applied (explicit keys win over merged ones).
fn merged(node: &Yaml) -> Yaml {
    match node {
        Yaml::Hash(hash) => {
            let mut out = yaml_rust2::yaml::Hash::new();
            if let Some(sources) = hash.get(&Yaml::String("<<".into())) {
                let sources = match sources {
                    Yaml::Array(list) => list.clone(),
                    one => vec![one.clone()],
                };
                for source in sources {
                    if let Yaml::Hash(h) = merged(&source) {
                        for (k, v) in h {
                            out.entry(k).or_insert(v);
                        }
                    }
                }
            }
            for (k, v) in hash {
                if k.as_str() != Some("<<") {
                    out.insert(k.clone(), merged(v));
                }
            }
            Yaml::Hash(out)
        }
        Yaml::Array(list) => Yaml::Array(list.iter().map(merged).collect()),
        other => other.clone(),
    }
}

fn compose() -> Yaml {
    let docs = YamlLoader::load_from_str(&repo_file("compose.yaml")).expect("compose.yaml parses");
    merged(&docs[0])
}

/// A scalar as Compose sees it in an environment map.
fn scalar(node: &Yaml) -> String {
    match node {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Null => String::new(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// One `${NAME}`, `${NAME-default}` or `${NAME:-default}` in a string.
#[derive(Debug, Clone, PartialEq)]
struct Interpolation {
    name: String,
    default: Option<String>,
    /// The whole string is this one interpolation.
    whole: bool,
}

fn interpolations(s: &str) -> Vec<Interpolation> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        let after = &rest[i + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            rest = escaped; // `$$` is a literal `$`
            continue;
        }
        let Some(body) = after.strip_prefix('{') else {
            rest = after;
            continue;
        };
        let end = body
            .find('}')
            .unwrap_or_else(|| panic!("unclosed ${{ in {s:?}"));
        let inner = &body[..end];
        let name_len = inner
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(inner.len());
        let (name, op) = inner.split_at(name_len);
        let default = op
            .strip_prefix(":-")
            .or_else(|| op.strip_prefix('-'))
            .map(str::to_string);
        assert!(
            op.is_empty() || default.is_some(),
            "unsupported interpolation ${{{inner}}} in {s:?}"
        );
        let whole = s.trim() == format!("${{{inner}}}");
        out.push(Interpolation {
            name: name.to_string(),
            default,
            whole,
        });
        rest = &body[end + 1..];
    }
    out
}

/// Every interpolation in the file's scalars (keys and values; comments are not YAML).
fn all_interpolations(node: &Yaml, out: &mut Vec<Interpolation>) {
    match node {
        Yaml::String(s) => out.extend(interpolations(s)),
        Yaml::Array(list) => list.iter().for_each(|n| all_interpolations(n, out)),
        Yaml::Hash(hash) => hash.iter().for_each(|(k, v)| {
            all_interpolations(k, out);
            all_interpolations(v, out);
        }),
        _ => {}
    }
}

/// A value with every interpolation replaced by its default, as with no .env.
fn with_defaults(s: &str) -> String {
    let mut out = s.to_string();
    for i in interpolations(s) {
        let default = i.default.clone().unwrap_or_default();
        for form in [
            format!("${{{}:-{default}}}", i.name),
            format!("${{{}-{default}}}", i.name),
        ] {
            out = out.replace(&form, &default);
        }
    }
    out
}

/// The environment map of one compose service, merge keys applied; `None` is a pass-through
/// (`NAME:` with no value: Compose sets it from .env or the shell, and leaves it unset otherwise).
fn service_env(compose: &Yaml, service: &str) -> BTreeMap<String, Option<String>> {
    let env = &compose["services"][service]["environment"];
    let Yaml::Hash(hash) = env else {
        panic!("compose.yaml: services.{service}.environment is not a map: {env:?}")
    };
    hash.iter()
        .map(|(k, v)| {
            let value = match v {
                Yaml::Null => None,
                v => Some(scalar(v)),
            };
            (scalar(k), value)
        })
        .collect()
}

/// Every pass-through variable of the embatch services.
fn pass_throughs(compose: &Yaml) -> Vec<String> {
    let mut out: Vec<String> = embatch_services()
        .iter()
        .flat_map(|(service, ..)| service_env(compose, service))
        .filter(|(_, value)| value.is_none())
        .map(|(name, _)| name)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A binary's flags by environment variable: (long flag, default value).
fn flags(command: &Command) -> BTreeMap<String, (String, Option<String>)> {
    command
        .get_arguments()
        .filter_map(|arg| {
            let env = arg.get_env()?.to_str()?.to_string();
            let long = arg
                .get_long()
                .expect("env flags have a long name")
                .to_string();
            let default = arg
                .get_default_values()
                .first()
                .map(|v| v.to_string_lossy().into_owned());
            Some((env, (long, default)))
        })
        .collect()
}

/// Parses `--flag value` pairs as the binary would (process environment ignored), returning the
/// resulting settings' Debug form.
fn parse<C: CommandFactory + FromArgMatches + Debug>(
    args: &[(String, String)],
) -> Result<String, String> {
    let command = C::command().mut_args(|arg| arg.env(None::<&'static str>));
    let argv = std::iter::once("bin".to_string()).chain(
        args.iter()
            .flat_map(|(long, value)| [format!("--{long}"), value.clone()]),
    );
    let matches = command
        .try_get_matches_from(argv)
        .map_err(|e| e.to_string())?;
    C::from_arg_matches(&matches)
        .map(|c| format!("{c:?}"))
        .map_err(|e| e.to_string())
}

/// The services that run an embatch binary, and which.
fn embatch_services() -> [(&'static str, &'static str, Command); 3] {
    [
        (
            "gateway",
            "embatch-gateway",
            embatch_gateway::Config::command(),
        ),
        (
            "worker",
            "embatch-worker",
            embatch_worker::Config::command(),
        ),
        (
            "worker-local",
            "embatch-worker",
            embatch_worker::Config::command(),
        ),
    ]
}

fn parse_for(binary: &str, args: &[(String, String)]) -> Result<String, String> {
    match binary {
        "embatch-gateway" => parse::<embatch_gateway::Config>(args),
        _ => parse::<embatch_worker::Config>(args),
    }
}

#[test]
fn compose_sets_only_flags_of_the_binaries_with_values_they_accept() {
    let compose = compose();
    let mut problems = Vec::new();
    for (service, binary, command) in embatch_services() {
        let flags = flags(&command);
        let env = service_env(&compose, service);
        assert!(
            env.len() > 5,
            "{service}: only {} variables found: {env:?}",
            env.len()
        );
        let mut args = Vec::new();
        for (name, value) in &env {
            if NOT_FLAGS.contains(&name.as_str()) {
                continue;
            }
            match (flags.get(name), value) {
                (None, _) => problems.push(format!("{service}: sets {name}, not a flag of {binary}")),
                (Some((long, _)), Some(value)) => args.push((long.clone(), with_defaults(value))),
                // A pass-through must be a flag with no default to repeat: else write the
                // default as ${NAME:-default}, so .env.example can show it.
                (Some((_, Some(default))), None) => problems.push(format!(
                    "{service}: passes {name} through, but {binary} has the default {default:?}: write ${{{name}:-{default}}}"
                )),
                (Some((_, None)), None) => {}
            }
        }
        // All at once, as the container gets them.
        if let Err(e) = parse_for(binary, &args) {
            problems.push(format!(
                "{service}: {binary} rejects compose.yaml's settings {args:?}: {e}"
            ));
        }
        for name in flags.keys().filter(|n| !env.contains_key(*n)) {
            if !LEFT_TO_THE_BINARY
                .iter()
                .any(|(s, n, _)| (*s == service || *s == "*") && n == name)
            {
                problems.push(format!(
                    "{service}: {name} is a flag of {binary} that compose.yaml does not set (set it as ${{{name}:-default}}, or list it in LEFT_TO_THE_BINARY with the reason)"
                ));
            }
        }
        for (s, name, _) in LEFT_TO_THE_BINARY
            .iter()
            .filter(|(s, ..)| *s == service || *s == "*")
        {
            if env.contains_key(*name) || !flags.contains_key(*name) {
                problems.push(format!(
                    "LEFT_TO_THE_BINARY: {s} {name} is set by compose.yaml or is no flag of {binary}"
                ));
            }
        }
        println!("{service}: {} flags set", args.len());
    }
    assert!(
        problems.is_empty(),
        "compose.yaml vs the binaries:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn compose_defaults_of_flags_are_the_binaries_defaults() {
    let compose = compose();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (service, binary, command) in embatch_services() {
        let flags = flags(&command);
        let baseline = parse_for(binary, &[]).expect("the binary's defaults parse");
        for (name, value) in service_env(&compose, service) {
            let (Some((long, binary_default)), Some(value)) = (flags.get(&name), value) else {
                continue;
            };
            let found = interpolations(&value);
            let [
                Interpolation {
                    default: Some(default),
                    whole: true,
                    ..
                },
            ] = found.as_slice()
            else {
                // A fixed value (NATS_URL, LISTEN_ADDR, ...): a fact of the compose network.
                continue;
            };
            checked += 1;
            if let Some((_, expected, _)) = DEPLOYMENT_DEFAULTS.iter().find(|(n, ..)| *n == name) {
                if default != expected {
                    problems.push(format!(
                        "{service}: {name} defaults to {default:?}, DEPLOYMENT_DEFAULTS says {expected:?}"
                    ));
                }
                continue;
            }
            // Same settings as with no flag at all (so "30s" and "30000ms" agree).
            match parse_for(binary, &[(long.clone(), default.clone())]) {
                Ok(parsed) if parsed == baseline => {}
                Ok(_) => problems.push(format!(
                    "{service}: {value} — the default {default:?} is not {binary}'s default {}",
                    binary_default
                        .as_deref()
                        .map_or("(none)".to_string(), |d| format!("{d:?}"))
                )),
                Err(e) => problems.push(format!("{service}: {name}={default:?}: {e}")),
            }
        }
    }
    assert!(
        checked >= 10,
        "only {checked} flag defaults found in compose.yaml"
    );
    assert!(
        problems.is_empty(),
        "compose.yaml defaults vs the binaries:\n  {}",
        problems.join("\n  ")
    );
}

/// `NAME=value` settings of .env.example, commented out (`# NAME=value`) or not: (line, name,
/// value, commented).
fn env_example() -> Vec<(usize, String, String, bool)> {
    let mut out = Vec::new();
    for (i, line) in repo_file(".env.example").lines().enumerate() {
        let line = line.trim();
        let (body, commented) = match line.strip_prefix('#') {
            Some(rest) => (rest.trim_start(), true),
            None => (line, false),
        };
        let setting = body.split_once('=').filter(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        });
        match setting {
            Some((name, value)) => {
                out.push((i + 1, name.to_string(), value.to_string(), commented))
            }
            None if commented || line.is_empty() => {} // prose
            None => panic!(
                ".env.example:{}: neither a comment nor NAME=value: {line:?}",
                i + 1
            ),
        }
    }
    out
}

#[test]
fn env_example_lists_every_compose_variable_with_its_default() {
    let mut found = Vec::new();
    all_interpolations(&compose(), &mut found);
    let mut defaults: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    let compose = compose();
    let pass_throughs = pass_throughs(&compose);
    assert!(
        pass_throughs.contains(&"PARTIAL_BATCH_SLOTS".to_string()),
        "PARTIAL_BATCH_SLOTS (no default) is passed through: {pass_throughs:?}"
    );
    for name in &pass_throughs {
        // Listed with an empty value: nothing is set unless the user sets it.
        defaults.insert(name.clone(), Some(String::new()));
    }
    for i in &found {
        if let Some(previous) = defaults.insert(i.name.clone(), i.default.clone())
            && previous != i.default
        {
            problems.push(format!(
                "compose.yaml: {} has two defaults, {previous:?} and {:?}",
                i.name, i.default
            ));
        }
    }
    assert!(
        defaults.len() >= 15,
        "only {} variables found in compose.yaml",
        defaults.len()
    );
    let example = env_example();
    let mut listed = BTreeMap::new();
    for (line, name, value, commented) in &example {
        if !commented {
            problems.push(format!(
                ".env.example:{line}: {name} is set; list it commented out (# {name}=...), as the default"
            ));
        }
        if listed.insert(name.clone(), value.clone()).is_some() {
            problems.push(format!(".env.example:{line}: {name} listed twice"));
        }
    }
    for (name, default) in &defaults {
        match (default, listed.get(name)) {
            (None, _) => problems.push(format!(
                "compose.yaml: ${{{name}}} has no default; write ${{{name}:-...}}"
            )),
            (Some(_), None) => problems.push(format!(
                "{name}: used in compose.yaml, missing from .env.example"
            )),
            (Some(d), Some(v)) if d != v => problems.push(format!(
                "{name}: .env.example says {v:?}, compose.yaml defaults to {d:?}"
            )),
            _ => {}
        }
    }
    for name in listed.keys() {
        if !defaults.contains_key(name) && !COMPOSE_VARIABLES.contains(&name.as_str()) {
            problems.push(format!("{name}: in .env.example, unused by compose.yaml"));
        }
    }
    assert!(
        problems.is_empty(),
        ".env.example vs compose.yaml:\n  {}",
        problems.join("\n  ")
    );
}

/// The `store_dir` of nats.conf's `jetstream { ... }` block.
fn jetstream_store_dir(conf: &str) -> Option<String> {
    let block = &conf[conf.find("\njetstream")?..];
    let block = &block[..block.find('}')?];
    block.lines().find_map(|line| {
        let (key, value) = line.trim().split_once(':')?;
        (key.trim() == "store_dir").then(|| value.trim().trim_matches('"').to_string())
    })
}

#[test]
fn jetstream_store_is_on_a_named_volume_of_nats() {
    let compose = compose();
    let store = jetstream_store_dir(&repo_file("nats/nats.conf"))
        .expect("nats/nats.conf has a jetstream block with a store_dir");
    let Yaml::Array(mounts) = &compose["services"]["nats"]["volumes"] else {
        panic!("compose.yaml: services.nats.volumes is not a list")
    };
    let named: Vec<(String, String)> = mounts
        .iter()
        .filter_map(|m| {
            let mut parts = m.as_str()?.split(':');
            let (source, target) = (parts.next()?, parts.next()?);
            // A named volume, not a bind mount of a host path.
            (!source.starts_with(['.', '/', '~'])).then(|| (source.to_string(), target.to_string()))
        })
        .collect();
    let Some((volume, _)) = named.iter().find(|(_, target)| {
        store == *target || store.starts_with(&format!("{}/", target.trim_end_matches('/')))
    }) else {
        panic!("JetStream's store_dir {store} is not inside a named volume of nats: {named:?}")
    };
    assert!(
        !compose["volumes"][volume.as_str()].is_badvalue(),
        "the volume {volume} is not declared under the top-level volumes"
    );
}

#[test]
fn tei_images_are_the_tei_release_the_gateway_mirrors() {
    let compose = compose();
    for service in ["tei-gpu", "tei-cpu"] {
        let image = compose["services"][service]["image"]
            .as_str()
            .unwrap_or_else(|| panic!("compose.yaml: {service} has no image"));
        let image = with_defaults(image);
        let tag = image.rsplit_once(':').map_or("", |(_, tag)| tag);
        // `1.9`, `cpu-1.9`, `hopper-1.9`, or a patch release such as `cpu-1.9.3`.
        let version = tag.rsplit('-').next().unwrap_or_default();
        assert!(
            version == TEI_MINOR || version.starts_with(&format!("{TEI_MINOR}.")),
            "{service}: {image} defaults to the tag {tag:?}, not TEI {TEI_MINOR}"
        );
    }
}

#[test]
fn gateway_waits_for_healthy_workers() {
    let compose = compose();
    for worker in ["worker", "worker-local"] {
        let dependency = &compose["services"]["gateway"]["depends_on"][worker];
        assert_eq!(
            dependency["condition"].as_str(),
            Some("service_healthy"),
            "gateway: depends_on.{worker} must wait for its health check: {dependency:?}"
        );
        // Only one of the two worker services runs under a profile.
        assert_eq!(
            dependency["required"].as_bool(),
            Some(false),
            "gateway: depends_on.{worker}.required must be false"
        );
        let test = &compose["services"][worker]["healthcheck"]["test"];
        let Yaml::Array(test) = test else {
            panic!("{worker}: no healthcheck test: {test:?}")
        };
        assert!(
            test.iter()
                .any(|part| part.as_str().is_some_and(|p| p.ends_with(":9091/health"))),
            "{worker}: the health check must ask the worker's /health: {test:?}"
        );
    }
}

#[test]
fn interpolation_parser() {
    assert_eq!(
        interpolations("${A:-x}/b:${B-1.8} $$ {C} $${D}"),
        vec![
            Interpolation {
                name: "A".into(),
                default: Some("x".into()),
                whole: false
            },
            Interpolation {
                name: "B".into(),
                default: Some("1.8".into()),
                whole: false
            },
        ]
    );
    assert_eq!(interpolations(" ${A:-} ")[0].default.as_deref(), Some(""));
    assert!(interpolations("${A}")[0].whole);
    assert_eq!(
        with_defaults("127.0.0.1:${P:-8222}:8222"),
        "127.0.0.1:8222:8222"
    );
}

/// The configuration tables (docs/configuration.md): every flag of both binaries has a table
/// row naming its environment variable and flag, with the binary's default in that row when it
/// has one; and every flag a row names (`` `--name` `` in its flag column) is a flag of one of
/// the binaries.
#[test]
fn configuration_tables_list_every_flag_with_its_default() {
    let section = repo_file("docs/configuration.md");
    let rows: Vec<&str> = section.lines().filter(|l| l.starts_with('|')).collect();
    let commands = [
        embatch_gateway::Config::command(),
        embatch_worker::Config::command(),
    ];
    let mut missing = Vec::new();
    let known: Vec<String> = commands
        .iter()
        .flat_map(|command| flags(command).into_values().map(|(long, _)| long))
        .collect();
    for row in &rows {
        // The second column: `--flag`, or `--a` / `--b` for a pair.
        let Some(column) = row.split('|').nth(2) else {
            continue;
        };
        for long in column.split('`').filter_map(|part| part.strip_prefix("--")) {
            if !known.iter().any(|k| k == long) {
                missing.push(format!("--{long}: a row for a flag neither binary has"));
            }
        }
    }
    for command in &commands {
        for (env, (long, default)) in flags(command) {
            let row = rows.iter().find(|row| {
                row.contains(&format!("`{env}`")) && row.contains(&format!("`--{long}`"))
            });
            match (row, default) {
                (None, _) => missing.push(format!("{env} (--{long}): no row")),
                (Some(row), Some(default)) if !row.contains(&format!("`{default}`")) => {
                    missing.push(format!("{env}: the row lacks the default `{default}`"))
                }
                _ => {}
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/configuration.md:\n{}",
        missing.join("\n")
    );
}
