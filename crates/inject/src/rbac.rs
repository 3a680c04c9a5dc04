//! Which service accounts the manifests let watch EndpointSlices, so that `inject`
//! writes `discovery = "kubernetes"` only where it can work: a Role or ClusterRole that
//! grants `list` and `watch` (and `get`) on `endpointslices` of `discovery.k8s.io`, bound
//! to the pod's service account by a RoleBinding (in its namespace) or a
//! ClusterRoleBinding (in every namespace). Without such RBAC in the files, a pod keeps
//! DNS discovery, which needs none; the annotation `tollgate.io/discovery` says
//! otherwise for RBAC kept elsewhere.

use yaml_rust2::Yaml;

use super::yaml::{get, items, str_at};

/// The namespace of a document that names none: the one `kubectl apply` puts it in,
/// the same for every such document of one run.
const UNNAMED: &str = "";

/// Who may watch EndpointSlices, and where, by the manifests' RBAC.
#[derive(Clone, Debug, Default)]
pub struct Watchers {
    grants: Vec<Grant>,
}

/// One binding of a role that can watch EndpointSlices.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Grant {
    /// Where it can watch (`None`: every namespace).
    namespace: Option<String>,
    who: Subject,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Subject {
    /// A service account, by namespace and name.
    Account { namespace: String, name: String },
    /// Every service account of a namespace (`system:serviceaccounts:NS`).
    AccountsOf(String),
    /// Every service account (`system:serviceaccounts`, `system:authenticated`).
    Everyone,
}

impl Watchers {
    /// The grants in `docs` (every document of the input, `List`s opened).
    pub fn read<'a>(docs: impl IntoIterator<Item = &'a Yaml>) -> Watchers {
        let mut all = Vec::new();
        for doc in docs {
            flatten(doc, &mut all);
        }
        // Roles that can watch, by (kind, namespace, name); a ClusterRole's namespace
        // is none.
        let roles: Vec<(&str, &str, &str)> = all
            .iter()
            .filter_map(|d| {
                let kind = str_at(d, "kind")?;
                if !matches!(kind, "Role" | "ClusterRole") || !can_watch(d) {
                    return None;
                }
                let namespace = if kind == "Role" {
                    namespace_of(d)
                } else {
                    UNNAMED
                };
                Some((kind, namespace, name_of(d)?))
            })
            .collect();
        let mut grants = Vec::new();
        for d in &all {
            let kind = str_at(d, "kind");
            if !matches!(kind, Some("RoleBinding" | "ClusterRoleBinding")) {
                continue;
            }
            let cluster_wide = kind == Some("ClusterRoleBinding");
            let at = namespace_of(d);
            let Some(role) = get(d, "roleRef") else {
                continue;
            };
            let (Some(role_kind), Some(role_name)) = (str_at(role, "kind"), str_at(role, "name"))
            else {
                continue;
            };
            // A RoleBinding's Role is in its own namespace; a ClusterRoleBinding binds
            // only ClusterRoles.
            let role_at = if role_kind == "Role" { at } else { UNNAMED };
            let known = roles
                .iter()
                .any(|&(k, ns, n)| k == role_kind && ns == role_at && n == role_name);
            if !known || (cluster_wide && role_kind != "ClusterRole") {
                continue;
            }
            let namespace = (!cluster_wide).then(|| at.to_string());
            for s in items(d, "subjects") {
                if let Some(who) = subject(s, at) {
                    grants.push(Grant {
                        namespace: namespace.clone(),
                        who,
                    });
                }
            }
        }
        Watchers { grants }
    }

    /// Whether the service account `account` of namespace `own` may watch the
    /// EndpointSlices of namespace `target` (`None`: its own).
    pub fn may_watch(&self, own: Option<&str>, account: &str, target: Option<&str>) -> bool {
        let own = own.unwrap_or(UNNAMED);
        let target = target.unwrap_or(own);
        self.grants.iter().any(|g| {
            g.namespace.as_deref().is_none_or(|ns| ns == target)
                && match &g.who {
                    Subject::Account { namespace, name } => namespace == own && name == account,
                    Subject::AccountsOf(ns) => ns == own,
                    Subject::Everyone => true,
                }
        })
    }
}

/// `doc`, or a `List`'s items, into `out`.
fn flatten<'a>(doc: &'a Yaml, out: &mut Vec<&'a Yaml>) {
    if str_at(doc, "kind").is_some_and(|k| k == "List" || k.ends_with("List")) {
        for item in items(doc, "items") {
            flatten(item, out);
        }
    } else {
        out.push(doc);
    }
}

fn name_of(doc: &Yaml) -> Option<&str> {
    get(doc, "metadata").and_then(|m| str_at(m, "name"))
}

fn namespace_of(doc: &Yaml) -> &str {
    get(doc, "metadata")
        .and_then(|m| str_at(m, "namespace"))
        .unwrap_or(UNNAMED)
}

/// A role's rules let it do what discovery does: list and watch every EndpointSlice,
/// and get the Service (for its ports and cluster IP). A rule limited to some
/// `resourceNames` cannot list.
fn can_watch(role: &Yaml) -> bool {
    let has = |rule: &Yaml, key: &str, want: &str| {
        items(rule, key)
            .iter()
            .any(|v| v.as_str().is_some_and(|v| v == want || v == "*"))
    };
    let (mut list, mut watch, mut get_service) = (false, false, false);
    for rule in items(role, "rules") {
        if !items(rule, "resourceNames").is_empty() {
            continue;
        }
        if has(rule, "apiGroups", "discovery.k8s.io") && has(rule, "resources", "endpointslices") {
            list |= has(rule, "verbs", "list");
            watch |= has(rule, "verbs", "watch");
        }
        if has(rule, "apiGroups", "") && has(rule, "resources", "services") {
            get_service |= has(rule, "verbs", "get");
        }
    }
    list && watch && get_service
}

/// A binding's subject that is a service account, or a group of them; `at` is the
/// binding's namespace, a service account's when it names none.
fn subject(s: &Yaml, at: &str) -> Option<Subject> {
    let name = str_at(s, "name")?;
    match str_at(s, "kind")? {
        "ServiceAccount" => Some(Subject::Account {
            namespace: str_at(s, "namespace").unwrap_or(at).to_string(),
            name: name.to_string(),
        }),
        "Group" => match name {
            "system:serviceaccounts" | "system:authenticated" => Some(Subject::Everyone),
            _ => name
                .strip_prefix("system:serviceaccounts:")
                .map(|ns| Subject::AccountsOf(ns.to_string())),
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watchers(text: &str) -> Watchers {
        let docs: Vec<Yaml> = super::super::yaml::split(text)
            .iter()
            .filter_map(|c| super::super::yaml::one(&c.text).ok())
            .collect();
        Watchers::read(docs.iter())
    }

    const ROLE: &str = "kind: Role\nmetadata:\n  name: watch-slices\n  namespace: shop\nrules:\n\
        - apiGroups: [\"\"]\n  resources: [services]\n  verbs: [get, watch]\n\
        - apiGroups: [discovery.k8s.io]\n  resources: [endpointslices]\n  verbs: [get, list, watch]\n";

    fn binding(kind: &str, role_kind: &str, subjects: &str) -> String {
        format!(
            "---\nkind: {kind}\nmetadata:\n  name: b\n  namespace: shop\nroleRef:\n  \
             apiGroup: rbac.authorization.k8s.io\n  kind: {role_kind}\n  name: watch-slices\n\
             subjects:\n{subjects}"
        )
    }

    const CART: &str = "- kind: ServiceAccount\n  name: cart\n  namespace: shop\n";

    #[test]
    fn a_role_bound_to_the_account_lets_it_watch_its_own_namespace_only() {
        let w = watchers(&format!("{ROLE}{}", binding("RoleBinding", "Role", CART)));
        assert!(w.may_watch(Some("shop"), "cart", None));
        assert!(w.may_watch(Some("shop"), "cart", Some("shop")));
        assert!(!w.may_watch(Some("shop"), "cart", Some("finance")));
        assert!(!w.may_watch(Some("shop"), "default", None));
        assert!(!w.may_watch(Some("other"), "cart", None));
    }

    #[test]
    fn a_cluster_role_bound_cluster_wide_reaches_every_namespace() {
        let role = ROLE.replace("kind: Role", "kind: ClusterRole");
        let w = watchers(&format!(
            "{role}{}",
            binding("ClusterRoleBinding", "ClusterRole", CART)
        ));
        assert!(w.may_watch(Some("shop"), "cart", Some("finance")));
        // Bound by a RoleBinding, a ClusterRole grants in that namespace only.
        let w = watchers(&format!(
            "{role}{}",
            binding("RoleBinding", "ClusterRole", CART)
        ));
        assert!(w.may_watch(Some("shop"), "cart", None));
        assert!(!w.may_watch(Some("shop"), "cart", Some("finance")));
    }

    #[test]
    fn what_cannot_watch_grants_nothing() {
        for role in [
            ROLE.replace("get, list, watch", "get, list"),
            ROLE.replace("discovery.k8s.io", "apps"),
            ROLE.replace("endpointslices", "endpoints"),
            ROLE.replace("[services]", "[pods]"),
            format!("{ROLE}  resourceNames: [payments-abc12]\n"),
        ] {
            let w = watchers(&format!("{role}{}", binding("RoleBinding", "Role", CART)));
            assert!(!w.may_watch(Some("shop"), "cart", None), "{role}");
        }
        // A binding whose role is not in the files, or a role bound by nobody.
        assert!(!watchers(&binding("RoleBinding", "Role", CART)).may_watch(
            Some("shop"),
            "cart",
            None
        ));
        assert!(!watchers(ROLE).may_watch(Some("shop"), "cart", None));
    }

    #[test]
    fn wildcards_groups_and_lists_count() {
        let role = ROLE
            .replace("[get, list, watch]", "[\"*\"]")
            .replace("[discovery.k8s.io]", "[\"*\"]");
        let groups = "- kind: Group\n  name: system:serviceaccounts:shop\n";
        let w = watchers(&format!("{role}{}", binding("RoleBinding", "Role", groups)));
        assert!(w.may_watch(Some("shop"), "anyone", None));
        assert!(!w.may_watch(Some("elsewhere"), "anyone", None));
        let list = format!(
            "kind: List\nitems:\n- {}\n",
            ROLE.trim_end().replace('\n', "\n  ")
        );
        let w = watchers(&format!("{list}{}", binding("RoleBinding", "Role", CART)));
        assert!(w.may_watch(Some("shop"), "cart", None));
    }

    #[test]
    fn documents_without_a_namespace_share_one() {
        let text = format!(
            "{ROLE}{}",
            binding(
                "RoleBinding",
                "Role",
                "- kind: ServiceAccount\n  name: cart\n"
            )
        )
        .replace("  namespace: shop\n", "");
        let w = watchers(&text);
        assert!(w.may_watch(None, "cart", None));
        assert!(!w.may_watch(Some("shop"), "cart", None));
    }
}
