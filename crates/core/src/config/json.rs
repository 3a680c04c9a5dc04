//! The effective config as JSON, for `GET /config`: every default filled in, durations
//! and sizes written the way the file takes them, and no secret material (certificate
//! and key *paths* are shown, never their contents). Each key shows itself as its
//! declaration in [`super::keys`] says.

use serde_json::{Value, json};

use super::keys;
use super::model::Config;

impl Config {
    pub fn to_json(&self) -> Value {
        let mut out = keys::root::SECTION.json(self);
        if let Value::Object(map) = &mut out {
            map.insert("file".to_string(), json!(self.file));
        }
        out
    }
}
