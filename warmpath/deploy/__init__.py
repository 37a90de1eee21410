"""Running a deployment on a cluster manager: ``warmpath deploy --ray`` (store, router and
workers as Ray actors; Ray is imported only there)."""
