"""Outbound: what mstail sends to other systems: webhooks, Alertmanager's v2 API and Prometheus remote write."""
