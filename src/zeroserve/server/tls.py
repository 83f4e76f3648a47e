"""TLS for the listener: the stdlib ``ssl`` module under the same ``BufferedProtocol``.

The event loop's SSL transport decrypts into its own buffer and then fills the buffer
our protocol's ``get_buffer()`` returned, so a body still lands in its arena lease, after
one copy out of the decryption buffer: counted at site ``tls`` (bytes received on TLS
connections). Everything above it stays zero-copy. A client that fails or stalls in the
handshake is closed by the loop after ``ssl_handshake_timeout`` (the head timeout),
before the protocol ever sees it.
"""

from __future__ import annotations

import ssl

from ..errors import ZeroserveError
from .options import TlsOptions


def server_context(options: TlsOptions) -> ssl.SSLContext:
    """A server context: TLS 1.2+, ALPN ``http/1.1``, client certificates required when
    ``ca_certs`` is given. Raises ``ZeroserveError`` naming the file that failed."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(options.certfile, options.keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ZeroserveError(
            f"cannot load the TLS certificate {options.certfile}"
            f"{' / key ' + options.keyfile if options.keyfile else ''}: {exc}"
        ) from None
    if options.ca_certs:
        try:
            ctx.load_verify_locations(cafile=options.ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise ZeroserveError(f"cannot load the TLS CA file {options.ca_certs}: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx
