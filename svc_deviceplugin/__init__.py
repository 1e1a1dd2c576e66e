"""numafit svc_deviceplugin: see DESIGN in the README; the service arrives with its issue."""
