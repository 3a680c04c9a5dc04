//! One AdmissionReview (v1), as the admission webhook answers it: the pod under review
//! rewritten as `tollgate inject` rewrites a manifest, with the config in the pod's own
//! annotation, sent back as a JSON Patch. The webhook never stands in a pod's way: a
//! pod it must not touch, or has injected already (a reinvocation), is allowed as it
//! is; one the rewrite would refuse (a port clash) is allowed unchanged with a warning
//! the client shows; anything but a Pod is allowed untouched.

use serde_json::{Value, json};

use super::add::{self, Injected, Options};
use super::pod::{Owner, pod_of};
use super::{patch, yaml};
use tollgate_core::discovery::base64::encode;

/// What happened to a review, for the metrics and the access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The pod got the sidecar.
    Injected,
    /// Injected already (a reinvocation), or not a pod: nothing to do.
    Unchanged,
    /// A pod tollgate must not touch.
    LeftAlone,
    /// The rewrite refused (a port clash, a bad annotation): admitted unchanged, warned.
    Refused,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Injected => "injected",
            Outcome::Unchanged => "unchanged",
            Outcome::LeftAlone => "left-alone",
            Outcome::Refused => "refused",
        }
    }
}

/// The answer to one review.
#[derive(Debug)]
pub struct Reviewed {
    /// The AdmissionReview to send back.
    pub response: Value,
    pub outcome: Outcome,
    /// The pod, as `NAMESPACE/NAME` (or its generateName), for the log.
    pub pod: String,
    /// What the rewrite said (the summary, its warnings, why it left the pod alone).
    pub notes: Vec<String>,
}

/// Answers the AdmissionReview `body`; an error when it is not one (HTTP 400).
pub fn review(body: &[u8], opts: &Options) -> Result<Reviewed, String> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    if doc["kind"] != "AdmissionReview" {
        return Err("not an AdmissionReview: kind is not AdmissionReview".into());
    }
    let request = &doc["request"];
    let uid = request["uid"]
        .as_str()
        .ok_or("an AdmissionReview without request.uid")?
        .to_string();
    let api_version = doc["apiVersion"]
        .as_str()
        .unwrap_or("admission.k8s.io/v1")
        .to_string();
    let namespace = request["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let object = &request["object"];
    let meta = &object["metadata"];
    let name = meta["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .or_else(|| meta["generateName"].as_str())
        .unwrap_or("pod")
        .to_string();
    let pod = format!("{namespace}/{name}");
    let answer = |patch: Option<&[Value]>, warnings: &[String]| {
        let mut response = json!({"uid": uid, "allowed": true});
        if let Some(ops) = patch.filter(|p| !p.is_empty()) {
            let text = serde_json::to_vec(ops).unwrap_or_default();
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(encode(&text));
        }
        if !warnings.is_empty() {
            response["warnings"] = json!(warnings);
        }
        json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response})
    };
    let is_pod = request["kind"]["kind"] == "Pod"
        && request["kind"]["group"].as_str().unwrap_or("").is_empty();
    let creating = request["operation"].as_str().is_none_or(|o| o == "CREATE");
    if !is_pod || !creating || !object.is_object() || request["subResource"].is_string() {
        return Ok(Reviewed {
            response: answer(None, &[]),
            outcome: Outcome::Unchanged,
            pod,
            notes: Vec::new(),
        });
    }
    let owner = Owner {
        kind: "Pod".into(),
        name: name.trim_end_matches('-').to_string(),
        namespace: Some(namespace.clone()).filter(|n| !n.is_empty()),
    };
    let mut doc = yaml::from_json(object);
    let injected = match pod_of(&mut doc, &owner) {
        Some(p) => add::inject(p, &owner, opts),
        None => Err(format!("{}: no pod spec", owner.show())),
    };
    let (ops, outcome, notes, warnings) = match injected {
        Ok(Injected::Done {
            summary, warnings, ..
        }) => {
            let after = yaml::to_json(&doc);
            let ops = patch::diff(object, &after);
            let mut notes = vec![summary];
            notes.extend(warnings);
            (ops, Outcome::Injected, notes, Vec::new())
        }
        Ok(Injected::Updated { summary, warnings }) => {
            let after = yaml::to_json(&doc);
            let ops = patch::diff(object, &after);
            let mut notes = vec![summary];
            notes.extend(warnings);
            (ops, Outcome::Injected, notes, Vec::new())
        }
        Ok(Injected::Already) => (Vec::new(), Outcome::Unchanged, Vec::new(), Vec::new()),
        Ok(Injected::LeftAlone(why)) => (
            Vec::new(),
            Outcome::LeftAlone,
            vec![format!("left alone: {why}")],
            Vec::new(),
        ),
        Err(e) => {
            let warning = format!("tollgate: not injected: {e}");
            (
                Vec::new(),
                Outcome::Refused,
                vec![warning.clone()],
                vec![warning],
            )
        }
    };
    Ok(Reviewed {
        response: answer(Some(&ops), &warnings),
        outcome,
        pod,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Delivery, Mode};

    fn opts() -> Options {
        Options {
            mode: Mode::Native,
            capture: false,
            image: "tollgate:test".into(),
            iptables_image: "tollgate-iptables:test".into(),
            delivery: Delivery::Annotation,
            watchers: Default::default(),
        }
    }

    fn review_of(pod: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "shop",
                "operation": "CREATE",
                "object": pod,
            }
        }))
        .unwrap_or_default()
    }

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-5d9c-"}, "spec": spec})
    }

    fn app() -> Value {
        json!({"containers": [{"name": "web", "image": "web:1",
            "env": [{"name": "PAYMENTS", "value": "http://payments:8080"}]}]})
    }

    /// The pod the answer's patch makes of `pod`.
    fn patched(pod: &Value, r: &Reviewed) -> Value {
        let mut out = pod.clone();
        if let Some(b64) = r.response["response"]["patch"].as_str() {
            assert_eq!(r.response["response"]["patchType"], "JSONPatch");
            let bytes = tollgate_core::discovery::base64::decode(b64).unwrap_or_default();
            let ops: Vec<Value> = serde_json::from_slice(&bytes).unwrap_or_default();
            patch::apply(&mut out, &ops).unwrap_or_else(|e| panic!("{e}"));
        }
        out
    }

    #[test]
    fn a_pod_is_injected_once_and_a_reinvocation_changes_nothing() {
        let before = pod(app());
        let r = review(&review_of(before.clone()), &opts()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.outcome, Outcome::Injected);
        assert_eq!(r.response["response"]["uid"], "u-1");
        assert_eq!(r.response["response"]["allowed"], true);
        assert_eq!(r.pod, "shop/web-5d9c-");
        let after = patched(&before, &r);
        assert_eq!(after["spec"]["initContainers"][0]["name"], "tollgate");
        let config = after["metadata"]["annotations"]["tollgate.io/config"]
            .as_str()
            .unwrap_or_default();
        assert!(
            config.contains("endpoints = [\"payments:8080\"]"),
            "{config}"
        );
        let again = review(&review_of(after.clone()), &opts()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.outcome, Outcome::Unchanged);
        assert!(again.response["response"]["patch"].is_null());
        assert_eq!(patched(&after, &again), after);
    }

    #[test]
    fn what_the_rewrite_refuses_is_admitted_unchanged_with_a_warning() {
        let clash = pod(json!({"containers": [{"name": "web", "image": "web:1",
            "ports": [{"containerPort": 15001}]}]}));
        let r = review(&review_of(clash), &opts()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.outcome, Outcome::Refused);
        assert!(r.response["response"]["patch"].is_null());
        let warning = r.response["response"]["warnings"][0]
            .as_str()
            .unwrap_or_default();
        assert!(
            warning.contains("container web's port 15001 collides with tollgate's listener 15001"),
            "{warning}"
        );
        let mut host = app();
        host["hostNetwork"] = json!(true);
        let r = review(&review_of(pod(host)), &opts()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.outcome, Outcome::LeftAlone);
        assert!(r.response["response"]["patch"].is_null());
    }

    #[test]
    fn a_jobs_pod_gets_the_native_sidecar_and_no_plain_one() {
        // A webhook sees the pod a Job made, never the Job: its restartPolicy and its
        // owner say it runs to completion, where a plain sidecar would keep it running.
        let mut job_pod = app();
        job_pod["restartPolicy"] = json!("Never");
        let mut owned = pod(job_pod);
        owned["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "report", "uid": "j-1"}]);
        let plain = Options {
            mode: Mode::Plain,
            ..opts()
        };
        let r = review(&review_of(owned.clone()), &plain).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.outcome, Outcome::LeftAlone);
        assert!(r.response["response"]["patch"].is_null());
        assert!(
            r.notes.iter().any(|n| n.contains("run to completion")),
            "{:?}",
            r.notes
        );
        // A bare pod that is never restarted, owned by nothing, the same.
        let mut bare = app();
        bare["restartPolicy"] = json!("OnFailure");
        let r = review(&review_of(pod(bare)), &plain).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.outcome, Outcome::LeftAlone);
        // Natively, its sidecar ends with it.
        let r = review(&review_of(owned.clone()), &opts()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.outcome, Outcome::Injected);
        let after = patched(&owned, &r);
        assert_eq!(
            after["spec"]["initContainers"][0]["restartPolicy"],
            "Always"
        );
        // A Deployment's pod (restarted always) still gets a plain one.
        let r = review(&review_of(pod(app())), &plain).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.outcome, Outcome::Injected);
    }

    #[test]
    fn anything_but_a_review_is_a_bad_request_and_anything_but_a_pod_passes() {
        assert!(review(b"{}", &opts()).is_err());
        assert!(review(b"not json", &opts()).is_err());
        let mut other = serde_json::from_slice::<Value>(&review_of(pod(app()))).unwrap_or_default();
        other["request"]["kind"]["kind"] = json!("Service");
        let r = review(&serde_json::to_vec(&other).unwrap_or_default(), &opts())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.outcome, Outcome::Unchanged);
        assert!(r.response["response"]["patch"].is_null());
    }
}
