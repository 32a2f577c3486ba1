"""Admission: the validating webhook (`cnidra webhook`) that refuses, before any pod uses it, a
claim the driver would refuse at prepare."""
