"""The mutating admission webhook that wires device-visibility env vars into group pods.

``admission`` decides (pure: review in, response out); ``groups`` remembers the cluster through
list+watch; ``server`` serves over TLS with ``tls`` reloading the certificate and ``metrics``
counting; ``configuration`` builds the MutatingWebhookConfiguration; ``certs`` and ``command``
are the ``deviceshare certs`` and ``deviceshare webhook`` commands.
"""
