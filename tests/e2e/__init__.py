"""End-to-end tests against real containerd (1.7 and 2.x with NRI) and runc: see README.md here."""
