"""Alerts: the rule table and its engine, the per-source windows they judge, and a run's fate
(finished, died, stopped)."""
