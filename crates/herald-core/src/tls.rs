//! What a client presents when it connects over TLS: the CA bundle it trusts (instead of the
//! default roots: the system's for Redis and etcd, Mozilla's bundled ones for the provider) and its own certificate and key, all PEM. The binary reads them from files
//! (Secrets mounted in the pod); each client crate (queue, coordination, provider) turns them
//! into its library's configuration.

/// A client's TLS material; empty means the default roots and no client certificate.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM certificates of the CAs to trust.
    pub ca: Option<Vec<u8>>,
    /// PEM certificate chain and private key of the client, for servers that ask for one.
    pub identity: Option<ClientIdentity>,
}

#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl ClientTls {
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.identity.is_none()
    }
}

// Key material never reaches a log line.
impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field(
                "ca",
                &self.ca.as_ref().map(|pem| format!("{} bytes", pem.len())),
            )
            .field(
                "identity",
                &self.identity.as_ref().map(|_| "(certificate and key)"),
            )
            .finish()
    }
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientIdentity(..)")
    }
}
