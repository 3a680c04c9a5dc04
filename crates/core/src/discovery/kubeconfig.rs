//! A kubeconfig file, read as kubectl reads it for the little a watch needs: the
//! current context's cluster (its `server` and the CA to trust), its user (a bearer
//! `token`, a `tokenFile`, or a client certificate and key) and its namespace.
//!
//! Pure: the text in, what it says out; the files it names are resolved against the
//! kubeconfig's own directory (as kubectl does) but read by `credentials`. What a
//! watch cannot use (an `exec` plugin, `auth-provider`, a username and password) is an
//! error that says so, rather than a watch that fails with 401 forever.

use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

use super::base64;

/// PEM given inline (`*-data`, decoded) or as a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pem {
    Data(Vec<u8>),
    File(PathBuf),
}

/// How requests prove who they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UserAuth {
    Token(String),
    /// Re-read at every connect: it may be rotated.
    TokenFile(PathBuf),
    /// A client certificate chain and its key (mTLS).
    Certificate {
        cert: Pem,
        key: Pem,
    },
    /// Nothing: the API may still allow anonymous reads.
    None,
}

/// What the current context says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kubeconfig {
    /// `https://host:port`, perhaps with a path.
    pub server: String,
    /// `None`: the platform's roots.
    pub ca: Option<Pem>,
    /// `tls-server-name`: the name to verify instead of the server's host.
    pub tls_server_name: Option<String>,
    pub user: UserAuth,
    /// The context's namespace; `None`: `default`.
    pub namespace: Option<String>,
}

/// Reads `text`; relative file names are found in `dir`.
pub fn parse(text: &str, dir: &Path) -> Result<Kubeconfig, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("not YAML: {e}"))?;
    let doc = docs.first().ok_or("the file is empty")?;
    let context_name = doc["current-context"]
        .as_str()
        .filter(|c| !c.is_empty())
        .ok_or("no current-context is set")?;
    let context = named(doc, "contexts", context_name, "context")?;
    let cluster_name = context["cluster"]
        .as_str()
        .ok_or_else(|| format!("context `{context_name}` names no cluster"))?;
    let cluster = named(doc, "clusters", cluster_name, "cluster")?;
    let server = cluster["server"]
        .as_str()
        .ok_or_else(|| format!("cluster `{cluster_name}` has no server"))?
        .to_string();
    if cluster["insecure-skip-tls-verify"].as_bool() == Some(true) {
        return Err(format!(
            "cluster `{cluster_name}` sets insecure-skip-tls-verify: tollgate always verifies \
             the API server; give its CA as certificate-authority-data"
        ));
    }
    let path = |p: &str| {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            dir.join(p)
        }
    };
    let pem = |map: &Yaml, key: &str| -> Result<Option<Pem>, String> {
        if let Some(data) = map[format!("{key}-data").as_str()].as_str() {
            let bytes = base64::decode(data).map_err(|e| format!("{key}-data: {e}"))?;
            return Ok(Some(Pem::Data(bytes)));
        }
        Ok(map[key].as_str().map(|p| Pem::File(path(p))))
    };
    let ca = pem(cluster, "certificate-authority")?;
    let tls_server_name = cluster["tls-server-name"].as_str().map(str::to_string);
    let user = match context["user"].as_str() {
        None => UserAuth::None,
        Some(user_name) => {
            let user = named(doc, "users", user_name, "user")?;
            user_auth(user, user_name, &pem, &path)?
        }
    };
    let namespace = context["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    Ok(Kubeconfig {
        server,
        ca,
        tls_server_name,
        user,
        namespace,
    })
}

type PemOf<'a> = dyn Fn(&Yaml, &str) -> Result<Option<Pem>, String> + 'a;

fn user_auth(
    user: &Yaml,
    name: &str,
    pem: &PemOf<'_>,
    path: &dyn Fn(&str) -> PathBuf,
) -> Result<UserAuth, String> {
    if let Some(token) = user["token"].as_str() {
        return Ok(UserAuth::Token(token.trim().to_string()));
    }
    if let Some(file) = user["tokenFile"].as_str() {
        return Ok(UserAuth::TokenFile(path(file)));
    }
    let cert = pem(user, "client-certificate")?;
    let key = pem(user, "client-key")?;
    match (cert, key) {
        (Some(cert), Some(key)) => return Ok(UserAuth::Certificate { cert, key }),
        (None, None) => {}
        _ => {
            return Err(format!(
                "user `{name}` has a client certificate or key without the other"
            ));
        }
    }
    for (key, what) in [
        ("exec", "an exec credential plugin"),
        ("auth-provider", "an auth-provider"),
        ("username", "a username and password"),
    ] {
        if !user[key].is_badvalue() {
            return Err(format!(
                "user `{name}` authenticates with {what}, which tollgate does not run; give \
                 it a token, tokenFile or client-certificate-data and client-key-data"
            ));
        }
    }
    Ok(UserAuth::None)
}

/// The entry of the list `list` whose `name` is `name`: its `what` (`context`,
/// `cluster`, `user`) mapping.
fn named<'y>(doc: &'y Yaml, list: &str, name: &str, what: &str) -> Result<&'y Yaml, String> {
    doc[list]
        .as_vec()
        .into_iter()
        .flatten()
        .find(|e| e["name"].as_str() == Some(name))
        .map(|e| &e[what])
        .filter(|e| !e.is_badvalue())
        .ok_or_else(|| format!("no {what} named `{name}` in {list}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    /// `CA` as base64, as a kubeconfig carries it.
    const CA_DATA: &str =
        "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=";

    fn config(user: &str, context_extra: &str) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: other
  cluster:
    server: https://other:6443
- name: test
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: {CA_DATA}
users:
- name: test
  user:
{user}
contexts:
- name: other
  context:
    cluster: other
- name: test
  context:
    cluster: test
    user: test
{context_extra}
current-context: test
"
        )
    }

    #[test]
    fn the_current_context_gives_server_ca_token_and_namespace() {
        let text = config("    token: abc123", "    namespace: shop");
        let k = parse(&text, Path::new("/home/u/.kube")).unwrap();
        assert_eq!(k.server, "https://127.0.0.1:6443");
        assert_eq!(k.ca, Some(Pem::Data(CA.as_bytes().to_vec())));
        assert_eq!(k.user, UserAuth::Token("abc123".into()));
        assert_eq!(k.namespace.as_deref(), Some("shop"));
        let k = parse(&config("    token: abc123", ""), Path::new("/")).unwrap();
        assert_eq!(k.namespace, None, "then `default`");
    }

    #[test]
    fn files_are_found_beside_the_kubeconfig() {
        let text = config("    tokenFile: token", "").replace(
            "certificate-authority-data: ",
            "certificate-authority: ca.crt\n    x: ",
        );
        let k = parse(&text, Path::new("/home/u/.kube")).unwrap();
        assert_eq!(k.ca, Some(Pem::File("/home/u/.kube/ca.crt".into())));
        assert_eq!(k.user, UserAuth::TokenFile("/home/u/.kube/token".into()));
    }

    #[test]
    fn a_client_certificate_is_read_inline_or_from_files() {
        let user = format!("    client-certificate-data: {CA_DATA}\n    client-key: /k/key.pem");
        let k = parse(&config(&user, ""), Path::new("/")).unwrap();
        assert_eq!(
            k.user,
            UserAuth::Certificate {
                cert: Pem::Data(CA.as_bytes().to_vec()),
                key: Pem::File("/k/key.pem".into()),
            }
        );
        let half = format!("    client-certificate-data: {CA_DATA}");
        let e = parse(&config(&half, ""), Path::new("/")).unwrap_err();
        assert!(e.contains("without the other"), "{e}");
    }

    #[test]
    fn what_a_watch_cannot_use_is_said() {
        for (text, says) in [
            ("", "empty"),
            ("a: [", "not YAML"),
            ("clusters: []\n", "no current-context"),
            (
                &config("    token: t", "").replace("current-context: test", "current-context: x"),
                "no context named `x`",
            ),
            (
                &config("    exec:\n      command: aws", ""),
                "an exec credential plugin",
            ),
            (
                &config("    token: t", "").replace(
                    &format!("certificate-authority-data: {CA_DATA}"),
                    "insecure-skip-tls-verify: true",
                ),
                "insecure-skip-tls-verify",
            ),
            (
                &config("    token: t", "").replace(CA_DATA, "not*base64"),
                "certificate-authority-data: `*`",
            ),
        ] {
            let e = parse(text, Path::new("/")).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
    }
}
