//! `tollgate inject`: Kubernetes manifests in, the same manifests out with tollgate in
//! every pod, as `linkerd inject` and `istioctl kube-inject` do for their proxies.
//!
//! It reads Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs, CronJobs and Pods
//! (files or standard input, many documents each, `List`s too) and writes each with the
//! sidecar (`add.rs`), preceded by a ConfigMap skeleton (`configmap.rs`). Every other
//! document, and every pod that has tollgate already as these options would put it, is
//! written back byte for byte: injecting twice changes nothing; a workload written anew
//! keeps its comments (`comments.rs`). `--uninject` takes it all out again (`remove.rs`), and
//! `--dry-run` shows the change as a diff instead (`diff.rs`). `--serve` runs the same
//! rewrite as a mutating admission webhook (`webhook.rs`, `review.rs`, `patch.rs`).

mod add;
mod comments;
mod configmap;
mod diff;
pub mod patch;
mod pod;
mod probes;
mod rbac;
mod record;
mod remove;
pub mod review;
mod sidecar;
pub mod webhook;
pub mod yaml;

use std::io::{Read, Write};
use std::path::PathBuf;

use yaml_rust2::Yaml;

pub use add::{Delivery, Options};
pub use sidecar::Mode;

use add::Injected;
use pod::{Found, Owner};
use yaml::Chunk;

/// Arguments of `tollgate inject`.
#[derive(clap::Args, Debug)]
pub struct InjectArgs {
    /// Manifests (YAML, any number of documents each); none or `-`: standard input.
    #[arg(conflicts_with = "serve")]
    pub files: Vec<PathBuf>,
    /// Serve the rewrite as a Kubernetes mutating admission webhook (AdmissionReview v1
    /// at POST /mutate, over TLS) instead of rewriting files.
    #[arg(long, requires_all = ["tls_cert", "tls_key"], conflicts_with_all = ["dry_run", "uninject"])]
    pub serve: bool,
    /// The webhook's address.
    #[arg(long, default_value = "0.0.0.0:8443", requires = "serve")]
    pub addr: std::net::SocketAddr,
    /// The webhook's certificate chain (PEM), for the name its Service is called by.
    #[arg(long, requires = "serve")]
    pub tls_cert: Option<PathBuf>,
    /// The webhook's private key (PEM).
    #[arg(long, requires = "serve")]
    pub tls_key: Option<PathBuf>,
    /// A plain sidecar container, for clusters before Kubernetes 1.29 (default: a
    /// native sidecar, an init container with `restartPolicy: Always`).
    #[arg(long)]
    pub plain: bool,
    /// Transparent capture: the `tollgate iptables` init container, and no proxy
    /// variables for the app.
    #[arg(long)]
    pub capture: bool,
    /// Print what would change, as a diff, instead of the manifests.
    #[arg(long)]
    pub dry_run: bool,
    /// Take tollgate out again (and the ConfigMaps labelled
    /// `app.kubernetes.io/component: tollgate`).
    #[arg(long, conflicts_with_all = ["plain", "capture"])]
    pub uninject: bool,
    /// The sidecar's image.
    #[arg(long, default_value = concat!("tollgate:", env!("CARGO_PKG_VERSION")))]
    pub image: String,
    /// The capture init container's image (`deploy/Dockerfile --target iptables`).
    #[arg(long, default_value = concat!("tollgate-iptables:", env!("CARGO_PKG_VERSION")))]
    pub iptables_image: String,
}

/// The command: 0 when every input was read and written, 1 otherwise (nothing is
/// written then).
pub fn main(args: InjectArgs) -> i32 {
    if args.serve {
        let (Some(tls_cert), Some(tls_key)) = (args.tls_cert.clone(), args.tls_key.clone()) else {
            eprintln!("tollgate inject --serve: --tls-cert and --tls-key are needed");
            return 2;
        };
        let serve = webhook::Serve {
            addr: args.addr,
            tls_cert,
            tls_key,
        };
        return webhook::serve(&serve, options(&args, Delivery::Annotation));
    }
    let inputs = match read_inputs(&args.files) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("tollgate inject: {e}");
            return 1;
        }
    };
    let opts = options(&args, Delivery::ConfigMap);
    let action = if args.uninject {
        Action::Uninject
    } else {
        Action::Inject(opts)
    };
    let out = match transform(&inputs, &action) {
        Ok(out) => out,
        Err(e) => {
            eprintln!("tollgate inject: {e}");
            return 1;
        }
    };
    for note in &out.notes {
        eprintln!("{note}");
    }
    let text = if args.dry_run {
        out.diff()
    } else {
        out.stream()
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tollgate inject: writing: {e}");
            1
        }
    }
}

fn options(args: &InjectArgs, delivery: Delivery) -> Options {
    Options {
        mode: if args.plain {
            Mode::Plain
        } else {
            Mode::Native
        },
        capture: args.capture,
        image: args.image.clone(),
        iptables_image: args.iptables_image.clone(),
        delivery,
        watchers: Default::default(),
    }
}

/// What to do to each pod.
pub enum Action {
    Inject(Options),
    Uninject,
}

/// An input: its name (the file, or `-`) and its text.
pub type Input = (String, String);

fn read_inputs(files: &[PathBuf]) -> Result<Vec<Input>, String> {
    let stdin = || {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("reading standard input: {e}"))?;
        Ok(("-".to_string(), text))
    };
    if files.is_empty() {
        return Ok(vec![stdin()?]);
    }
    files
        .iter()
        .map(|f| {
            if f.as_os_str() == "-" {
                return stdin();
            }
            let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
            Ok((f.display().to_string(), text))
        })
        .collect()
}

/// One document of the output: how it is separated from the one before, its text, and
/// (for `--dry-run`) what it was, in the same style, and where it came from.
#[derive(Debug)]
struct OutDoc {
    separator: Option<String>,
    text: String,
    was: Option<String>,
    source: String,
}

/// The documents to write, and the notes for standard error.
#[derive(Debug, Default)]
pub struct Output {
    docs: Vec<OutDoc>,
    pub notes: Vec<String>,
}

impl Output {
    /// The manifests, one stream.
    pub fn stream(&self) -> String {
        let mut out = String::new();
        // A document dropped (`--uninject`'s ConfigMaps) leaves nothing, not even its `---`.
        let kept = self
            .docs
            .iter()
            .filter(|d| !(d.text.is_empty() && d.was.is_some()));
        for (i, d) in kept.enumerate() {
            if i > 0 && !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            match &d.separator {
                Some(sep) => out.push_str(sep),
                None if i > 0 => out.push_str("---\n"),
                None => {}
            }
            out.push_str(&d.text);
        }
        out
    }

    /// The changes, one diff per document changed, added or dropped.
    pub fn diff(&self) -> String {
        let mut out = String::new();
        for d in &self.docs {
            if let Some(was) = &d.was {
                let what = title(was).or_else(|| title(&d.text)).unwrap_or_default();
                let from = format!("{} {what}", d.source);
                out.push_str(&diff::unified(
                    was,
                    &d.text,
                    &from,
                    &format!("{from} (injected)"),
                ));
            }
        }
        out
    }
}

/// `Kind/name` of a document's text, for a diff's header.
fn title(text: &str) -> Option<String> {
    let doc = yaml::load(text).ok()?.into_iter().next()?;
    let kind = yaml::str_at(&doc, "kind")?;
    let name = yaml::get(&doc, "metadata").and_then(|m| yaml::str_at(m, "name"))?;
    Some(format!("{kind}/{name}"))
}

/// Every input's documents, each injected, uninjected or left as it was.
pub fn transform(inputs: &[Input], action: &Action) -> Result<Output, String> {
    let mut parsed = Vec::new();
    for (source, text) in inputs {
        for (n, chunk) in yaml::split(text).into_iter().enumerate() {
            let mut docs = yaml::load(&chunk.text)
                .map_err(|e| format!("{source}: document {}: {e}", n + 1))?;
            if docs.len() > 1 {
                return Err(format!(
                    "{source}: document {}: more than one document without a `---` line between",
                    n + 1
                ));
            }
            parsed.push((source.clone(), chunk, docs.pop()));
        }
    }
    let existing: Vec<String> = parsed
        .iter()
        .filter_map(|(_, _, d)| d.as_ref())
        .filter(|d| yaml::str_at(d, "kind") == Some("ConfigMap"))
        .filter_map(|d| Some(yaml::str_at(yaml::get(d, "metadata")?, "name")?.to_string()))
        .collect();
    // The input's RBAC: which pods may watch EndpointSlices.
    let rbac = rbac::Watchers::read(parsed.iter().filter_map(|(_, _, d)| d.as_ref()));
    let action = &match action {
        Action::Inject(opts) => Action::Inject(Options {
            watchers: std::sync::Arc::new(rbac),
            ..opts.clone()
        }),
        Action::Uninject => Action::Uninject,
    };
    let mut out = Output::default();
    for (source, chunk, doc) in parsed {
        let Some(doc) = doc else {
            out.docs.push(verbatim(&source, chunk));
            continue;
        };
        let mut new = doc.clone();
        let mut made = Vec::new();
        let changed = match action {
            Action::Inject(opts) => {
                inject_doc(&mut new, opts, &existing, &mut made, &mut out.notes)?
            }
            Action::Uninject => {
                if is_tollgate_config_map(&new) {
                    out.docs.push(OutDoc {
                        separator: chunk.separator,
                        text: String::new(),
                        was: Some(yaml::emit(&doc)),
                        source,
                    });
                    continue;
                }
                uninject_doc(&mut new, &mut out.notes)?
            }
        };
        for extra in made {
            out.docs.push(OutDoc {
                separator: Some("---\n".into()),
                text: yaml::emit(&extra),
                was: Some(String::new()),
                source: source.clone(),
            });
        }
        if changed {
            // Written anew, with the comments of the text it came from put back.
            let written = |d: &Yaml| {
                format!(
                    "{}{}",
                    yaml::leading_comments(&chunk.text),
                    comments::carry(&chunk.text, &yaml::emit(d))
                )
            };
            out.docs.push(OutDoc {
                text: written(&new),
                was: Some(written(&doc)),
                separator: chunk.separator,
                source,
            });
        } else {
            out.docs.push(verbatim(&source, chunk));
        }
    }
    if let Some(first) = out.docs.iter_mut().find(|d| !d.text.is_empty()) {
        // The stream's first document needs no separator before it.
        if first.separator.as_deref() == Some("---\n") && first.was.as_deref() == Some("") {
            first.separator = None;
        }
    }
    Ok(out)
}

fn verbatim(source: &str, chunk: Chunk) -> OutDoc {
    OutDoc {
        separator: chunk.separator,
        text: chunk.text,
        was: None,
        source: source.to_string(),
    }
}

fn is_tollgate_config_map(doc: &Yaml) -> bool {
    yaml::str_at(doc, "kind") == Some("ConfigMap")
        && yaml::get(doc, "metadata")
            .and_then(|m| yaml::get(m, "labels"))
            .and_then(|l| yaml::str_at(l, "app.kubernetes.io/component"))
            == Some("tollgate")
}

/// Injects a document's pods (a `List`'s items too); the ConfigMaps to write before it
/// go to `made`.
fn inject_doc(
    doc: &mut Yaml,
    opts: &Options,
    existing: &[String],
    made: &mut Vec<Yaml>,
    notes: &mut Vec<String>,
) -> Result<bool, String> {
    match pod::classify(doc) {
        Found::List => {
            let mut changed = false;
            if let Some(items) = yaml::get_mut(doc, "items").and_then(Yaml::as_mut_vec) {
                for item in items.iter_mut() {
                    changed |= inject_doc(item, opts, existing, made, notes)?;
                }
            }
            Ok(changed)
        }
        Found::Pod(owner) => inject_pod(doc, &owner, opts, existing, made, notes),
        Found::Other => Ok(false),
    }
}

fn inject_pod(
    doc: &mut Yaml,
    owner: &Owner,
    opts: &Options,
    existing: &[String],
    made: &mut Vec<Yaml>,
    notes: &mut Vec<String>,
) -> Result<bool, String> {
    if owner.name.is_empty() {
        return Err(format!("a {} without metadata.name", owner.kind));
    }
    let pod = pod::pod_of(doc, owner).ok_or_else(|| format!("{}: no pod spec", owner.show()))?;
    match add::inject(pod, owner, opts)? {
        Injected::LeftAlone(why) => {
            notes.push(format!("{}: left alone: {why}", owner.show()));
            Ok(false)
        }
        Injected::Updated { summary, warnings } => {
            notes.push(format!(
                "{} (updated: injected already; its ConfigMap kept as it is)",
                summary.replacen("injected ", "re-injected ", 1)
            ));
            for w in warnings {
                notes.push(format!("  warning: {}: {w}", owner.show()));
            }
            Ok(true)
        }
        Injected::Already => {
            notes.push(format!(
                "{}: has tollgate already, left as it is",
                owner.show()
            ));
            Ok(false)
        }
        Injected::Done {
            config_map,
            summary,
            warnings,
        } => {
            notes.push(summary);
            for w in warnings {
                notes.push(format!("  warning: {}: {w}", owner.show()));
            }
            let name = configmap::name_for(owner);
            if existing.contains(&name) {
                notes.push(format!(
                    "  ConfigMap {name} is in the input: kept, none written"
                ));
            } else {
                made.push(config_map);
            }
            Ok(true)
        }
    }
}

fn uninject_doc(doc: &mut Yaml, notes: &mut Vec<String>) -> Result<bool, String> {
    match pod::classify(doc) {
        Found::List => {
            let mut changed = false;
            if let Some(items) = yaml::get_mut(doc, "items").and_then(Yaml::as_mut_vec) {
                for item in items.iter_mut() {
                    changed |= uninject_doc(item, notes)?;
                }
            }
            Ok(changed)
        }
        Found::Pod(owner) => {
            let Some(pod) = pod::pod_of(doc, &owner) else {
                return Ok(false);
            };
            let changed = remove::uninject(pod, &owner)?;
            if changed {
                notes.push(format!("uninjected {}", owner.show()));
            }
            Ok(changed)
        }
        Found::Other => Ok(false),
    }
}
