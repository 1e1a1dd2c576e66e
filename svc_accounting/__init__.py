"""numafit svc_accounting: see DESIGN in the README; the service arrives with its issue."""
