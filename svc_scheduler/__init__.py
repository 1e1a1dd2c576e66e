"""numafit svc_scheduler: see DESIGN in the README; the service arrives with its issue."""
