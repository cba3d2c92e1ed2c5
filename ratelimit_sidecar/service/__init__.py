"""The service layer: turns Envoy's ShouldRateLimit messages into core calls and back."""
