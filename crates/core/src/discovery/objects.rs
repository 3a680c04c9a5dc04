//! The API's objects, as far as a watch reads them: an EndpointSlice (its addresses,
//! their conditions, its ports and address type) and a Service (its cluster IP, IP
//! families and ports), and the set of ready addresses they make together.
//!
//! Pure: JSON in, addresses out, so every rule of the API's meaning is tested here
//! without a server. The rules, as kube-proxy applies them: an endpoint is ready when
//! `conditions.ready` is true or absent (the API: "nil should be interpreted as
//! ready"), and never while `terminating` (its requests in flight finish, it takes no
//! new one); only slices of the Service's first IP family count; the port is the slice
//! port whose name is the Service port's name (the empty name for an unnamed port).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use serde::Deserialize;

use crate::config::ServicePort;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    fn from_api(word: &str) -> Option<Family> {
        match word {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Meta {
    name: String,
    #[serde(rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Deserialize)]
struct RawSlice {
    #[serde(default)]
    metadata: Meta,
    #[serde(rename = "addressType")]
    address_type: String,
    #[serde(default)]
    endpoints: Option<Vec<RawEndpoint>>,
    #[serde(default)]
    ports: Option<Vec<RawPort>>,
}

#[derive(Deserialize)]
struct RawEndpoint {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    conditions: Option<Conditions>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Conditions {
    ready: Option<bool>,
    terminating: Option<bool>,
}

#[derive(Deserialize)]
struct RawPort {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    port: Option<u16>,
}

/// What one EndpointSlice holds for a watch: its family, its named ports and its
/// ready addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    pub name: String,
    /// `None`: `FQDN` slices, which no kube-proxy routes to either.
    pub family: Option<Family>,
    /// Name (empty when unnamed) and number.
    pub ports: Vec<(String, u16)>,
    pub ready: Vec<IpAddr>,
    pub resource_version: Option<String>,
}

impl Slice {
    /// An EndpointSlice object.
    pub fn from_json(v: serde_json::Value) -> Result<Slice, String> {
        let raw: RawSlice =
            serde_json::from_value(v).map_err(|e| format!("an EndpointSlice: {e}"))?;
        let family = Family::from_api(&raw.address_type);
        let ports = raw
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| Some((p.name.unwrap_or_default(), p.port?)))
            .collect();
        let mut ready = Vec::new();
        for e in raw.endpoints.unwrap_or_default() {
            let c = e.conditions.unwrap_or_default();
            if c.ready == Some(false) || c.terminating == Some(true) {
                continue;
            }
            // A slice's addresses are of its own type; one that is not an IP literal
            // is left out rather than failing the slice.
            ready.extend(
                e.addresses
                    .iter()
                    .filter_map(|a| a.parse::<IpAddr>().ok())
                    .filter(|ip| Some(Family::of(ip)) == family),
            );
        }
        Ok(Slice {
            name: raw.metadata.name,
            family,
            ports,
            ready,
            resource_version: raw.metadata.resource_version,
        })
    }
}

/// What the Service says: where it is under capture, its family, its ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// `None` for a headless Service.
    pub cluster_ip: Option<IpAddr>,
    /// The first of `spec.ipFamilies`, else the cluster IP's, else IPv4.
    pub family: Family,
    /// Name (empty when unnamed) and number.
    pub ports: Vec<(String, u16)>,
}

#[derive(Deserialize)]
struct RawService {
    spec: RawServiceSpec,
}

#[derive(Deserialize)]
struct RawServiceSpec {
    #[serde(rename = "clusterIP", default)]
    cluster_ip: Option<String>,
    #[serde(rename = "ipFamilies", default)]
    ip_families: Option<Vec<String>>,
    #[serde(default)]
    ports: Option<Vec<RawPort>>,
}

impl Service {
    pub fn from_slice(body: &[u8]) -> Result<Service, String> {
        let raw: RawService =
            serde_json::from_slice(body).map_err(|e| format!("a Service: {e}"))?;
        let cluster_ip = raw
            .spec
            .cluster_ip
            .as_deref()
            .and_then(|ip| ip.parse::<IpAddr>().ok());
        let family = raw
            .spec
            .ip_families
            .as_ref()
            .and_then(|f| f.first())
            .and_then(|f| Family::from_api(f))
            .or(cluster_ip.as_ref().map(Family::of))
            .unwrap_or(Family::V4);
        let ports = raw
            .spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| Some((p.name.unwrap_or_default(), p.port?)))
            .collect();
        Ok(Service {
            cluster_ip,
            family,
            ports,
        })
    }

    /// The name the slices give the configured port: the name itself, or the name of
    /// the Service port with that number. `None`: the Service has no such port.
    pub fn port_name<'a>(&'a self, port: &'a ServicePort) -> Option<&'a str> {
        match port {
            ServicePort::Name(n) => Some(n),
            ServicePort::Number(p) => self
                .ports
                .iter()
                .find(|(_, number)| number == p)
                .map(|(n, _)| n.as_str()),
        }
    }

    /// The Service port's number: the one configured, or the one of that name.
    pub fn port_number(&self, port: &ServicePort) -> Option<u16> {
        match port {
            ServicePort::Number(p) => Some(*p),
            ServicePort::Name(n) => self
                .ports
                .iter()
                .find(|(name, _)| name == n)
                .map(|(_, p)| *p),
        }
    }

    /// `clusterIP:port`, what a captured connection to the Service dials.
    pub fn cluster_addr(&self, port: &ServicePort) -> Option<SocketAddr> {
        Some(SocketAddr::new(self.cluster_ip?, self.port_number(port)?))
    }
}

/// The ready addresses of every slice, of the Service's family, at the port named as
/// the Service's; sorted and each once, so that only a real change is a change.
pub fn ready(
    slices: &HashMap<String, Slice>,
    service: &Service,
    port: &ServicePort,
) -> Vec<SocketAddr> {
    let Some(name) = service.port_name(port) else {
        return Vec::new();
    };
    let mut out: Vec<SocketAddr> = slices
        .values()
        .filter(|s| s.family == Some(service.family))
        .filter_map(|s| {
            let (_, number) = s.ports.iter().find(|(n, _)| n == name)?;
            Some(s.ready.iter().map(move |ip| SocketAddr::new(*ip, *number)))
        })
        .flatten()
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// A list of EndpointSlices: its items and the version to watch from.
pub struct List {
    pub slices: Vec<Slice>,
    pub resource_version: String,
}

#[derive(Deserialize)]
struct RawList {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    items: Option<Vec<serde_json::Value>>,
}

impl List {
    pub fn from_slice(body: &[u8]) -> Result<List, String> {
        let raw: RawList =
            serde_json::from_slice(body).map_err(|e| format!("an EndpointSliceList: {e}"))?;
        let resource_version = raw
            .metadata
            .resource_version
            .filter(|v| !v.is_empty())
            .ok_or("an EndpointSliceList without metadata.resourceVersion")?;
        let slices = raw
            .items
            .unwrap_or_default()
            .into_iter()
            .map(Slice::from_json)
            .collect::<Result<_, _>>()?;
        Ok(List {
            slices,
            resource_version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(family: &str, port: serde_json::Value, endpoints: serde_json::Value) -> Slice {
        Slice::from_json(json!({
            "metadata": {"name": "s", "resourceVersion": "7"},
            "addressType": family,
            "ports": [port],
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    fn service(family: &str, ports: serde_json::Value) -> Service {
        Service::from_slice(
            json!({"spec": {"clusterIP": "10.0.0.9", "ipFamilies": [family], "ports": ports}})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn ready_means_ready_true_or_absent_and_not_terminating() {
        let s = slice(
            "IPv4",
            json!({"name": "http", "port": 8080}),
            json!([
                {"addresses": ["10.1.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.1.0.2"], "conditions": {}},
                {"addresses": ["10.1.0.3"]},
                {"addresses": ["10.1.0.4"], "conditions": {"ready": false}},
                {"addresses": ["10.1.0.5"], "conditions": {"ready": true, "terminating": true}},
                {"addresses": ["10.1.0.6"], "conditions": {"ready": null}},
                {"addresses": ["not-an-ip"], "conditions": {"ready": true}},
            ]),
        );
        let want: Vec<IpAddr> = ["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.6"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(s.ready, want);
        assert_eq!(s.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn only_the_services_first_family_counts() {
        let v4 = slice(
            "IPv4",
            json!({"name": "http", "port": 80}),
            json!([{"addresses": ["10.1.0.1"]}]),
        );
        let v6 = slice(
            "IPv6",
            json!({"name": "http", "port": 80}),
            json!([{"addresses": ["fd00::1"]}, {"addresses": ["fd00::2"], "conditions": {"ready": false}}]),
        );
        let slices = HashMap::from([("a".to_string(), v4), ("b".to_string(), v6)]);
        let http = ServicePort::Name("http".into());
        let six = service("IPv6", json!([{"name": "http", "port": 80}]));
        assert_eq!(
            ready(&slices, &six, &http),
            ["[fd00::1]:80".parse::<SocketAddr>().unwrap()]
        );
        let four = service("IPv4", json!([{"name": "http", "port": 80}]));
        assert_eq!(
            ready(&slices, &four, &http),
            ["10.1.0.1:80".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn a_port_is_found_by_name_or_by_the_services_number() {
        let s = Slice::from_json(json!({
            "metadata": {"name": "s"},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}],
            "endpoints": [{"addresses": ["10.1.0.2"]}, {"addresses": ["10.1.0.1"]}],
        }))
        .unwrap();
        let slices = HashMap::from([("s".to_string(), s)]);
        let svc = service(
            "IPv4",
            json!([{"name": "http", "port": 80}, {"name": "metrics", "port": 9000}]),
        );
        let addrs = |port: ServicePort| {
            ready(&slices, &svc, &port)
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            addrs(ServicePort::Name("http".into())),
            ["10.1.0.1:8080", "10.1.0.2:8080"],
            "sorted"
        );
        assert_eq!(
            addrs(ServicePort::Number(9000)),
            ["10.1.0.1:9090", "10.1.0.2:9090"]
        );
        assert!(addrs(ServicePort::Number(1234)).is_empty(), "no such port");
        assert!(addrs(ServicePort::Name("grpc".into())).is_empty());
        assert_eq!(
            svc.port_number(&ServicePort::Name("metrics".into())),
            Some(9000)
        );
        assert_eq!(
            svc.cluster_addr(&ServicePort::Name("http".into())),
            Some("10.0.0.9:80".parse().unwrap())
        );
    }

    #[test]
    fn an_unnamed_port_matches_an_unnamed_slice_port() {
        let s = Slice::from_json(json!({
            "metadata": {"name": "s"},
            "addressType": "IPv4",
            "ports": [{"port": 8080}],
            "endpoints": [{"addresses": ["10.1.0.1"]}],
        }))
        .unwrap();
        let slices = HashMap::from([("s".to_string(), s)]);
        let svc = service("IPv4", json!([{"port": 80}]));
        assert_eq!(
            ready(&slices, &svc, &ServicePort::Number(80)),
            ["10.1.0.1:8080".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn a_headless_service_has_no_cluster_address_and_empty_fields_are_absent() {
        let svc = Service::from_slice(
            br#"{"spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}}"#,
        )
        .unwrap();
        assert_eq!(svc.cluster_ip, None);
        assert_eq!(svc.family, Family::V4);
        assert_eq!(svc.cluster_addr(&ServicePort::Number(80)), None);
        let empty = Slice::from_json(json!({
            "metadata": {"name": "e"},
            "addressType": "IPv4",
            "endpoints": null,
            "ports": null,
        }))
        .unwrap();
        assert!(empty.ready.is_empty() && empty.ports.is_empty());
        let v6 = Service::from_slice(br#"{"spec": {"clusterIP": "fd00::10"}}"#).unwrap();
        assert_eq!(
            v6.family,
            Family::V6,
            "from the cluster IP without ipFamilies"
        );
    }

    #[test]
    fn a_list_needs_its_resource_version() {
        let list = List::from_slice(
            br#"{"metadata": {"resourceVersion": "42"}, "items": [
                {"metadata": {"name": "a"}, "addressType": "IPv4", "endpoints": []}]}"#,
        )
        .unwrap();
        assert_eq!(list.resource_version, "42");
        assert_eq!(list.slices.len(), 1);
        assert!(List::from_slice(br#"{"items": []}"#).is_err());
        assert!(List::from_slice(b"<html>").is_err());
        assert!(
            Slice::from_json(json!({"metadata": {"name": "x"}})).is_err(),
            "no addressType"
        );
    }
}
