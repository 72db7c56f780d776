//! The peer checks of the TLS configurations: a server certificate's
//! chain, name and identity, and a client certificate's identity.

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::ParsedCertificate;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, RootCertStore,
    SignatureScheme,
};

use super::identity::{identity_of, Identity};
use super::provider::provider;

/// A certificate that chains to the CA but names the wrong identity.
#[derive(Debug)]
pub(super) struct IdentityRefused(pub(super) String);

impl fmt::Display for IdentityRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IdentityRefused {}

/// The server-certificate check of every client configuration here:
/// webpki's chain check against `ca.crt` (server use), the host name when
/// `check_name`, then the identity.
#[derive(Debug)]
pub(super) struct ServerVerifier {
    pub(super) roots: Arc<RootCertStore>,
    pub(super) algs: WebPkiSupportedAlgorithms,
    pub(super) want: Want,
    pub(super) check_name: bool,
}

impl ServerVerifier {
    pub(super) fn new(roots: Arc<RootCertStore>, want: Want, check_name: bool) -> ServerVerifier {
        ServerVerifier {
            roots,
            algs: provider().signature_verification_algorithms,
            want,
            check_name,
        }
    }
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algs.all,
        )?;
        if self.check_name {
            verify_server_name(&cert, server_name)?;
        }
        self.want.check_tls(end_entity)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// The client-certificate check of every server configuration here:
/// webpki's (chain to `ca.crt`, client use; whether a certificate is
/// required), then the identity.
#[derive(Debug)]
pub(super) struct IdentityClientVerifier {
    pub(super) inner: Arc<dyn ClientCertVerifier>,
    pub(super) want: Want,
}

impl ClientCertVerifier for IdentityClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)?;
        self.want.check_tls(end_entity)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Which identity a verifier lets through, once the chain is good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    AnyNode,
    Node(u64),
    AnyClient,
}

impl Want {
    fn check(self, end_entity: &[u8]) -> Result<Identity, String> {
        let identity = identity_of(end_entity)
            .map_err(|e| format!("the certificate is not ringlock's: {e}"))?;
        match (self, &identity) {
            (Want::AnyNode, Identity::Node(_)) | (Want::AnyClient, Identity::Client(_)) => {}
            (Want::Node(want), Identity::Node(got)) if want == *got => {}
            (Want::Node(want), _) => {
                return Err(format!(
                    "the certificate is {identity}'s, not node {want}'s"
                ))
            }
            (Want::AnyNode, _) => {
                return Err(format!(
                    "the certificate is {identity}'s; a node's is required here"
                ))
            }
            (Want::AnyClient, _) => {
                return Err(format!(
                    "the certificate is {identity}'s; a client's is required here"
                ))
            }
        }
        Ok(identity)
    }

    /// As [`check`](Self::check), as the rustls error that fails the
    /// handshake (a bad-certificate alert to the peer).
    fn check_tls(self, end_entity: &[u8]) -> Result<Identity, rustls::Error> {
        self.check(end_entity).map_err(|e| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
                IdentityRefused(e),
            ))))
        })
    }
}
