"""The mutating admission webhook that wires device-visibility env vars into group pods."""
