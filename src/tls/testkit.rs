//! Test fixtures shared by the TLS tests here and the driver's: a CA made
//! at test time with [`gen`] (as `ringlock cert` makes one), issuing node
//! and client certificates and loading them.

use super::gen::{self, Issued, Issuer, Validity};
use super::{ClientTls, NodeTls};

/// A CA and the means to issue under it.
pub(crate) struct Ca {
    pub(crate) cert: Issued,
    pub(crate) issuer: Issuer,
}

pub(crate) fn new_ca() -> Ca {
    let cert = gen::ca(Validity::days(30)).expect("CA");
    let issuer = Issuer::from_pem(
        "ca.crt",
        cert.cert_pem.as_bytes(),
        "ca.key",
        cert.key_pem.as_bytes(),
    )
    .expect("issuer");
    Ca { cert, issuer }
}

impl Ca {
    pub(crate) fn pem(&self) -> &[u8] {
        self.cert.cert_pem.as_bytes()
    }

    pub(crate) fn node_cert(&self, id: u64) -> Issued {
        let hosts = [format!("node{id}.example"), format!("10.1.2.{id}")];
        self.issuer
            .node(id, &hosts, Validity::days(1))
            .expect("node cert")
    }

    pub(crate) fn client_cert(&self, name: &str) -> Issued {
        self.issuer
            .client(name, Validity::days(1))
            .expect("client cert")
    }

    pub(crate) fn node(&self, id: u64) -> NodeTls {
        let c = self.node_cert(id);
        NodeTls::from_pem(
            self.pem(),
            c.cert_pem.as_bytes(),
            c.key_pem.as_bytes(),
            Some(id),
        )
        .expect("node loads")
    }

    pub(crate) fn client(&self, name: Option<&str>) -> ClientTls {
        let own = name.map(|n| self.client_cert(n));
        ClientTls::from_pem(
            self.pem(),
            own.as_ref()
                .map(|c| (c.cert_pem.as_bytes(), c.key_pem.as_bytes())),
        )
        .expect("client loads")
    }
}
