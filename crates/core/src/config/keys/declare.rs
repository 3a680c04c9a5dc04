//! `keys!`: a section's keys, one line each. Each key becomes a constant holding its
//! name (what the parser reads it by), an entry of `NAMES` (the keys the section
//! takes, in order) and a [`Key`](super::Key) of `SECTION`.
//!
//! ```text
//! keys! {
//!     section "listener" of ListenerConfig = Some(ListenerConfig::default);
//!     addr: "address", model, Restart, "where the app sends its outbound HTTP",
//!         |c| json!(c.addr.to_string());
//! }
//! ```
//!
//! After the name: the TOML type, what the key stands at unwritten (`model`: the
//! model's default; `required`; or words), when a change takes effect (`Applied` or
//! `Restart`), one line of doc, and how `/config` shows the value. A reload names a key
//! whose shown value changed; a key whose value shows less than the model holds (a
//! password, the certificates read from a file) ends with `, same: |a, b| …`, how a
//! change to it is seen. A key whose value is a section below may end with
//! `, apart NAME: |c| …` for each key of that section the model holds beside it, which
//! a reload then names on its own ([`Part`](super::Part)).

macro_rules! keys {
    (
        section $path:literal of $model:ty = $defaults:expr;
        $(
            $name:ident: $kind:literal, $unset:tt, $reload:ident, $doc:literal, $show:expr
            $(, same: $same:expr)?
            $(, apart $part:ident: $part_show:expr)*;
        )*
    ) => {
        $(
            #[doc = $doc]
            #[allow(non_upper_case_globals)]
            pub const $name: &str = stringify!($name);
        )*

        /// The keys this section takes, in the order messages list them.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        pub static SECTION: $crate::config::keys::Section<$model> =
            $crate::config::keys::Section {
                path: $path,
                defaults: $defaults,
                keys: &[$(
                    $crate::config::keys::Key {
                        name: stringify!($name),
                        kind: $kind,
                        unset: keys!(@unset $unset),
                        reload: $crate::config::keys::Reload::$reload,
                        doc: $doc,
                        show: $show,
                        same: keys!(@same $($same)?),
                        parts: &[$(
                            $crate::config::keys::Part {
                                name: stringify!($part),
                                show: $part_show,
                            }
                        ),*],
                    }
                ),*],
            };
    };
    (@same) => {
        None
    };
    (@same $same:expr) => {
        Some($same)
    };
    (@unset model) => {
        $crate::config::keys::Unset::Model
    };
    (@unset required) => {
        $crate::config::keys::Unset::Required
    };
    (@unset $words:literal) => {
        $crate::config::keys::Unset::Said($words)
    };
}
