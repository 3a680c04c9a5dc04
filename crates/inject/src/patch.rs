//! A JSON Patch (RFC 6902) from one JSON document to another: what the admission
//! webhook answers with. Objects are compared member by member (a member added, removed
//! or replaced where it differs); an array that differs is replaced whole, which keeps
//! the patch correct whatever moved inside it (containers inserted first, say).

use serde_json::{Map, Value, json};

/// The operations that turn `from` into `to`.
pub fn diff(from: &Value, to: &Value) -> Vec<Value> {
    let mut ops = Vec::new();
    walk(from, to, &mut String::new(), &mut ops);
    ops
}

fn walk(from: &Value, to: &Value, path: &mut String, ops: &mut Vec<Value>) {
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => objects(a, b, path, ops),
        _ if from == to => {}
        _ => ops.push(json!({"op": "replace", "path": path.as_str(), "value": to})),
    }
}

fn objects(
    a: &Map<String, Value>,
    b: &Map<String, Value>,
    path: &mut String,
    ops: &mut Vec<Value>,
) {
    for (k, old) in a {
        let at = path.len();
        push_token(path, k);
        match b.get(k) {
            None => ops.push(json!({"op": "remove", "path": path.as_str()})),
            Some(new) => walk(old, new, path, ops),
        }
        path.truncate(at);
    }
    for (k, new) in b {
        if a.contains_key(k) {
            continue;
        }
        let at = path.len();
        push_token(path, k);
        ops.push(json!({"op": "add", "path": path.as_str(), "value": new}));
        path.truncate(at);
    }
}

/// `/key`, with `~` and `/` escaped as RFC 6901 says.
fn push_token(path: &mut String, key: &str) {
    path.push('/');
    for c in key.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

/// Applies `ops` (as [`diff`] writes them) to `doc`: for the tests, and to check a
/// patch before it is sent.
pub fn apply(doc: &mut Value, ops: &[Value]) -> Result<(), String> {
    for op in ops {
        let kind = op["op"].as_str().ok_or("an operation without op")?;
        let path = op["path"].as_str().ok_or("an operation without path")?;
        if path.is_empty() {
            if kind != "replace" {
                return Err(format!("{kind} of the whole document"));
            }
            *doc = op["value"].clone();
            continue;
        }
        let (parent, last) = path.rsplit_once('/').ok_or("a path without /")?;
        let last = last.replace("~1", "/").replace("~0", "~");
        let target = if parent.is_empty() {
            Some(&mut *doc)
        } else {
            doc.pointer_mut(parent)
        };
        let Some(Value::Object(map)) = target else {
            return Err(format!("{path}: no object there"));
        };
        match kind {
            "add" | "replace" => {
                map.insert(last, op["value"].clone());
            }
            "remove" => {
                map.remove(&last)
                    .ok_or(format!("{path}: nothing to remove"))?;
            }
            other => return Err(format!("{other}: not written here")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_turns_one_document_into_the_other() {
        let from = json!({
            "metadata": {"name": "web", "annotations": {"a/b": "1", "gone": "x"}},
            "spec": {"containers": [{"name": "web"}], "hostname": "h"}
        });
        let to = json!({
            "metadata": {"name": "web", "annotations": {"a/b": "2", "tollgate.io/config": "c"}},
            "spec": {"containers": [{"name": "tollgate"}, {"name": "web"}], "volumes": [{"name": "v"}]}
        });
        let ops = diff(&from, &to);
        assert!(ops.contains(
            &json!({"op": "replace", "path": "/metadata/annotations/a~1b", "value": "2"})
        ));
        assert!(ops.contains(&json!({"op": "remove", "path": "/spec/hostname"})));
        let mut got = from.clone();
        apply(&mut got, &ops).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, to);
        assert!(diff(&to, &to).is_empty());
    }
}
