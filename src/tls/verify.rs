//! The peer checks of the TLS configurations: a server certificate's
//! chain, name and identity, and a client certificate's identity.

use super::*;

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
