"""numafit svc_refit: see DESIGN in the README; the service arrives with its issue."""
