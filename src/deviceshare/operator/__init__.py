"""The Kopf operator: a secondary scheduler for group pods and the SharedDeviceGroup reconciler."""
