"""A throwaway CA and a server certificate for 127.0.0.1, as PEM files: what the HTTPS and the
gRPC TLS tests serve with."""

from __future__ import annotations

from pathlib import Path

import trustme


def server_certificate(folder: Path) -> tuple[trustme.CA, Path, Path]:
    """(the CA, the certificate chain file, the key file), written under ``folder``."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = folder / "server.pem", folder / "server.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(cert_file), append=True)
    cert.private_key_pem.write_to_path(str(key_file))
    return ca, cert_file, key_file
