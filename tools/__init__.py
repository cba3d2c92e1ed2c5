"""Development scripts run from a checkout (`make proto`); not part of the wheel."""
