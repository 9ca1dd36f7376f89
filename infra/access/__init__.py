"""Who may do what, computed from Google's own role and method data (pure: no Pulumi imports)."""
