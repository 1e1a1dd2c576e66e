"""The schemas of the served kinds, in schema.py's notation (the descriptions are our own words).

Pod specs and containers, object metadata, node specs, namespaces, quotas, config maps, both
Event versions, Bindings and NodeResourceTopology are described field by field (closed), so a
typo in them is caught as kubectl users expect; statuses and the deep corners of a pod spec
(probes, affinity, volume sources, security contexts) are open types.
"""

from __future__ import annotations

from .schema import Catalog

CATALOG = Catalog()

meta = CATALOG.package("meta", "io.k8s.apimachinery.pkg.apis.meta.v1", "v1")
resource = CATALOG.package("resource", "io.k8s.apimachinery.pkg.api.resource", "resource")
intstr = CATALOG.package("intstr", "io.k8s.apimachinery.pkg.util.intstr", "intstr")
core = CATALOG.package("core", "io.k8s.api.core.v1", "v1")
events = CATALOG.package("events", "io.k8s.api.events.v1", "v1")
nrt = CATALOG.package("nrt", "io.k8s.node.topology.v1alpha2", "v1alpha2")

_API_VERSION = ("string", "The versioned schema of this representation of an object.")
_KIND = ("string", "The REST resource this object represents, in CamelCase.")
_METADATA = ("meta.ObjectMeta", "Standard object metadata.")

# --- scalars ---------------------------------------------------------------------------------

resource.scalar(
    "Quantity",
    "A fixed-point number with an optional SI or binary suffix, such as 100m, 2 or 4Gi.",
    frozenset({"string", "integer", "number"}),
    {"type": "string"},
    {"oneOf": [{"type": "string"}, {"type": "number"}]},
)
intstr.scalar(
    "IntOrString",
    "Either an integer or a string.",
    frozenset({"string", "integer"}),
    {"type": "string", "format": "int-or-string"},
    {"x-kubernetes-int-or-string": True},
)
meta.scalar(
    "Time",
    "A timestamp in RFC 3339 form, to the second.",
    frozenset({"string"}),
    {"type": "string", "format": "date-time"},
)
meta.scalar(
    "MicroTime",
    "A timestamp in RFC 3339 form, to the microsecond.",
    frozenset({"string"}),
    {"type": "string", "format": "date-time"},
)
meta.scalar(
    "FieldsV1",
    "A set of fields in the trie form server-side apply records.",
    frozenset({"object"}),
    {"type": "object"},
)
meta.scalar(
    "Patch",
    "A patch: a JSON patch, a JSON merge patch, a strategic merge patch or an apply "
    "configuration, as its Content-Type says.",
    frozenset({"object", "array"}),
    {"type": "object"},
)

# --- object metadata -------------------------------------------------------------------------

meta.struct(
    "ObjectMeta",
    "Metadata every persisted object has: its name, labels, annotations and the "
    "server-assigned identity and version.",
    {
        "name": ("string", "The object's name, unique within its namespace and kind."),
        "generateName": ("string", "A prefix the server completes into a unique name."),
        "namespace": ("string", "The namespace the object lives in (empty: cluster-scoped)."),
        "selfLink": ("string", "Deprecated and never set."),
        "uid": ("string", "The server-assigned identity, unique in time and space."),
        "resourceVersion": (
            "string",
            "An opaque version of the object, for optimistic concurrency and watches.",
        ),
        "generation": ("int64", "How often the desired state changed (set by the server)."),
        "creationTimestamp": ("Time", "When the server created the object."),
        "deletionTimestamp": ("Time", "When the object is to be deleted (set by the server)."),
        "deletionGracePeriodSeconds": ("int64", "Seconds left to the object's graceful end."),
        "labels": ("{}string", "Identifying key/value pairs that selectors match."),
        "annotations": ("{}string", "Non-identifying key/value pairs for tools and people."),
        "ownerReferences": (
            "[]OwnerReference@uid",
            "The objects this one depends on; deleting them collects it.",
        ),
        "finalizers": ("[]string@set", "What must happen before the object is removed."),
        "managedFields": (
            "[]ManagedFieldsEntry",
            "Which manager owns which fields (server-side apply's bookkeeping).",
        ),
    },
)
meta.struct(
    "OwnerReference",
    "A reference to an owning object, in the same namespace.",
    {
        "apiVersion": "string",
        "kind": "string",
        "name": "string",
        "uid": "string",
        "controller": ("boolean", "Whether this owner is the managing controller."),
        "blockOwnerDeletion": ("boolean", "Whether the owner waits for this dependent."),
    },
    required=("apiVersion", "kind", "name", "uid"),
)
meta.struct(
    "ManagedFieldsEntry",
    "The fields one manager owns, and the operation that gave them to it.",
    {
        "manager": ("string", "The manager's name (the request's fieldManager)."),
        "operation": ("string", "Apply or Update."),
        "apiVersion": ("string", "The version the field set is expressed in."),
        "time": ("Time", "When the manager last changed one of its fields."),
        "fieldsType": ("string", "The format of fieldsV1; only FieldsV1."),
        "fieldsV1": ("FieldsV1", "The owned fields."),
        "subresource": ("string", "The subresource the operation wrote, if any."),
    },
)

# --- pods ------------------------------------------------------------------------------------

core.struct(
    "Pod",
    "A group of containers scheduled together onto one node.",
    {
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _METADATA,
        "spec": ("PodSpec", "The desired behaviour of the pod."),
        "status": ("PodStatus", "The observed state of the pod, written by its node."),
    },
    gvk=("", "v1", "Pod"),
)
core.struct(
    "PodSpec",
    "The desired state of a pod.",
    {
        "volumes": ("[]Volume@name", "Volumes the pod's containers can mount."),
        "initContainers": ("[]Container@name", "Containers run in order before the others."),
        "containers": ("[]Container@name", "The pod's containers (at least one)."),
        "ephemeralContainers": ("[]EphemeralContainer@name", "Debugging containers."),
        "restartPolicy": ("string", "Always, OnFailure or Never."),
        "terminationGracePeriodSeconds": ("int64", "Seconds a pod gets to stop gracefully."),
        "activeDeadlineSeconds": ("int64", "Seconds the pod may be active before it fails."),
        "dnsPolicy": ("string", "How the pod's DNS is set up (ClusterFirst by default)."),
        "nodeSelector": ("{}string", "Labels a node must have to run the pod."),
        "serviceAccountName": ("string", "The ServiceAccount the pod runs as."),
        "serviceAccount": ("string", "Deprecated alias of serviceAccountName."),
        "automountServiceAccountToken": ("boolean", "Whether to mount the account's token."),
        "nodeName": ("string", "The node the pod is bound to (set by binding)."),
        "hostNetwork": ("boolean", "Whether the pod uses the node's network namespace."),
        "hostPID": ("boolean", "Whether the pod uses the node's PID namespace."),
        "hostIPC": ("boolean", "Whether the pod uses the node's IPC namespace."),
        "shareProcessNamespace": ("boolean", "Whether containers share one PID namespace."),
        "securityContext": ("PodSecurityContext", "Pod-level security attributes."),
        "imagePullSecrets": ("[]LocalObjectReference@name", "Secrets for pulling images."),
        "hostname": ("string", "The pod's hostname (its name by default)."),
        "subdomain": ("string", "The pod's DNS subdomain."),
        "affinity": ("Affinity", "Scheduling constraints relative to nodes and pods."),
        "schedulerName": ("string", "The scheduler that places the pod."),
        "tolerations": ("[]Toleration", "Taints the pod tolerates."),
        "hostAliases": ("[]HostAlias@ip", "Extra /etc/hosts entries."),
        "priorityClassName": ("string", "The pod's PriorityClass."),
        "priority": ("int32", "The pod's priority (from its PriorityClass)."),
        "dnsConfig": ("PodDNSConfig", "DNS settings merged into the policy's."),
        "readinessGates": ("[]PodReadinessGate", "Extra conditions pod readiness waits for."),
        "runtimeClassName": ("string", "The RuntimeClass to run the pod with."),
        "enableServiceLinks": ("boolean", "Whether service environment variables are set."),
        "preemptionPolicy": ("string", "PreemptLowerPriority or Never."),
        "overhead": ("{}Quantity", "Resources the pod's sandbox takes."),
        "topologySpreadConstraints": (
            "[]TopologySpreadConstraint",
            "How pods spread across topology domains.",
        ),
        "setHostnameAsFQDN": ("boolean", "Whether the hostname is the fully qualified name."),
        "os": ("PodOS", "The operating system the pod needs."),
        "hostUsers": ("boolean", "Whether the pod uses the host's user namespace."),
        "schedulingGates": ("[]PodSchedulingGate@name", "Gates that hold the pod unscheduled."),
        "resourceClaims": ("[]PodResourceClaim@name", "Dynamic resources the pod claims."),
        "resources": ("ResourceRequirements", "Pod-level requests and limits."),
    },
    required=("containers",),
)
core.struct(
    "Container",
    "One application container of a pod.",
    {
        "name": ("string", "The container's name, unique within the pod."),
        "image": ("string", "The container image."),
        "command": ("[]string", "The entrypoint (the image's ENTRYPOINT by default)."),
        "args": ("[]string", "Arguments to the entrypoint (the image's CMD by default)."),
        "workingDir": ("string", "The working directory."),
        "ports": ("[]ContainerPort@containerPort,protocol=TCP", "Ports the container exposes."),
        "envFrom": ("[]EnvFromSource", "Sources of environment variables."),
        "env": ("[]EnvVar@name", "Environment variables."),
        "resources": ("ResourceRequirements", "Compute resources the container needs."),
        "resizePolicy": ("[]ContainerResizePolicy", "How each resource may be resized."),
        "restartPolicy": ("string", "Always for a sidecar init container."),
        "volumeMounts": ("[]VolumeMount@mountPath", "Volumes mounted into the container."),
        "volumeDevices": ("[]VolumeDevice@devicePath", "Block devices for the container."),
        "livenessProbe": ("Probe", "When the container is restarted."),
        "readinessProbe": ("Probe", "When the container is ready for traffic."),
        "startupProbe": ("Probe", "When the container has started."),
        "lifecycle": ("Lifecycle", "Hooks run after start and before stop."),
        "terminationMessagePath": ("string", "Where the container writes its last words."),
        "terminationMessagePolicy": ("string", "File or FallbackToLogsOnError."),
        "imagePullPolicy": ("string", "Always, Never or IfNotPresent."),
        "securityContext": ("SecurityContext", "Container-level security attributes."),
        "stdin": ("boolean", "Whether the container has a stdin buffer."),
        "stdinOnce": ("boolean", "Whether stdin closes after the first attach."),
        "tty": ("boolean", "Whether the container gets a TTY."),
    },
    required=("name",),
)
core.struct(
    "ContainerPort",
    "A network port of a container.",
    {
        "name": ("string", "A name services can refer to."),
        "hostPort": ("int32", "The port on the node."),
        "containerPort": ("int32", "The port in the container."),
        "protocol": ("string", "TCP, UDP or SCTP (TCP by default)."),
        "hostIP": ("string", "The node address to bind the host port to."),
    },
    required=("containerPort",),
)
core.struct(
    "EnvVar",
    "One environment variable.",
    {
        "name": ("string", "The variable's name."),
        "value": ("string", "The variable's value, with $(VAR) references expanded."),
        "valueFrom": ("EnvVarSource", "Where the value comes from instead."),
    },
    required=("name",),
)
core.struct(
    "ResourceRequirements",
    "Compute resources requested and limited.",
    {
        "limits": ("{}Quantity", "The most of each resource that may be used."),
        "requests": ("{}Quantity", "The least of each resource that is needed (scheduling)."),
        "claims": ("[]ResourceClaim@name", "Dynamic resource claims used."),
    },
)
core.struct(
    "ResourceClaim",
    "The use of one of the pod's resource claims.",
    {"name": "string", "request": "string"},
    required=("name",),
)
core.struct(
    "VolumeMount",
    "A volume mounted into a container.",
    {
        "name": ("string", "The volume's name."),
        "readOnly": ("boolean", "Whether the mount is read-only."),
        "recursiveReadOnly": ("string", "Disabled, IfPossible or Enabled."),
        "mountPath": ("string", "Where in the container the volume appears."),
        "subPath": ("string", "The path within the volume to mount."),
        "mountPropagation": ("string", "How mounts propagate between host and container."),
        "subPathExpr": ("string", "subPath with $(VAR) references expanded."),
    },
    required=("name", "mountPath"),
)
core.struct(
    "Toleration",
    "A taint the pod tolerates.",
    {
        "key": ("string", "The taint key (empty with operator Exists: every key)."),
        "operator": ("string", "Exists or Equal."),
        "value": ("string", "The taint value to match."),
        "effect": ("string", "NoSchedule, PreferNoSchedule or NoExecute (empty: all)."),
        "tolerationSeconds": ("int64", "How long a NoExecute taint is tolerated."),
    },
)
core.struct(
    "LocalObjectReference", "The name of an object in the same namespace.", {"name": "string"}
)
core.struct(
    "HostAlias",
    "An /etc/hosts entry.",
    {"ip": "string", "hostnames": "[]string"},
    required=("ip",),
)
core.struct(
    "PodReadinessGate",
    "A pod condition readiness waits for.",
    {"conditionType": "string"},
    required=("conditionType",),
)
core.struct(
    "PodSchedulingGate",
    "A gate that keeps the pod from being scheduled while present.",
    {"name": "string"},
    required=("name",),
)
core.struct(
    "ContainerResizePolicy",
    "Whether resizing a resource restarts the container.",
    {"resourceName": "string", "restartPolicy": "string"},
    required=("resourceName", "restartPolicy"),
)
core.open("Volume", "A named volume and its source.", {"name": "string"})
core.open("EphemeralContainer", "A debugging container.", {"name": "string", "image": "string"})
core.open("EnvVarSource", "A source for an environment variable's value.")
core.open("EnvFromSource", "A source of a set of environment variables.")
core.open(
    "VolumeDevice", "A raw block volume in a container.", {"name": "string", "devicePath": "string"}
)
core.open("Probe", "A health check of a container.")
core.open("Lifecycle", "Actions on container start and stop.")
core.open("SecurityContext", "Security settings of a container.")
core.open("PodSecurityContext", "Security settings of a pod.")
core.open("Affinity", "Node affinity and pod (anti-)affinity rules.")
core.open("PodDNSConfig", "DNS parameters of a pod.")
core.open("TopologySpreadConstraint", "How pods spread across a topology.")
core.open("PodOS", "The operating system of a pod.", {"name": "string"})
core.open("PodResourceClaim", "A resource claim of a pod.", {"name": "string"})
core.open(
    "PodStatus",
    "The observed state of a pod.",
    {
        "phase": ("string", "Pending, Running, Succeeded, Failed or Unknown."),
        "conditions": ("[]PodCondition@type", "The pod's current conditions."),
        "message": ("string", "Why the pod is in this state, for people."),
        "reason": ("string", "Why the pod is in this state, in CamelCase."),
        "nominatedNodeName": ("string", "The node preemption made room on."),
        "hostIP": ("string", "The address of the pod's node."),
        "podIP": ("string", "The pod's address."),
        "startTime": ("Time", "When the node acknowledged the pod."),
        "qosClass": ("string", "Guaranteed, Burstable or BestEffort."),
        "initContainerStatuses": ("[]ContainerStatus", "Init container states."),
        "containerStatuses": ("[]ContainerStatus", "Container states."),
    },
)
core.open(
    "PodCondition",
    "One condition of a pod.",
    {"type": "string", "status": "string", "reason": "string", "message": "string"},
)
core.open("ContainerStatus", "The state of one container.", {"name": "string", "ready": "boolean"})

# --- nodes, namespaces, quotas, config maps --------------------------------------------------

core.struct(
    "Node",
    "A worker machine pods run on.",
    {
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _METADATA,
        "spec": ("NodeSpec", "How the node is to be configured."),
        "status": ("NodeStatus", "The node's observed state, written by its kubelet."),
    },
    gvk=("", "v1", "Node"),
)
core.struct(
    "NodeSpec",
    "How a node is to be configured.",
    {
        "podCIDR": ("string", "The pod address range of the node."),
        "podCIDRs": ("[]string@set", "The pod address ranges (one per IP family)."),
        "providerID": ("string", "The cloud provider's ID of the node."),
        "unschedulable": ("boolean", "Whether new pods are kept off the node (cordon)."),
        "taints": ("[]Taint", "Taints that repel pods not tolerating them."),
        "configSource": ("NodeConfigSource", "Deprecated."),
        "externalID": ("string", "Deprecated."),
    },
)
core.struct(
    "Taint",
    "A mark on a node that repels pods not tolerating it.",
    {
        "key": "string",
        "value": "string",
        "effect": ("string", "NoSchedule, PreferNoSchedule or NoExecute."),
        "timeAdded": ("Time", "When a NoExecute taint was added."),
    },
    required=("key", "effect"),
)
core.open("NodeConfigSource", "Deprecated.")
core.open(
    "NodeStatus",
    "The observed state of a node.",
    {
        "capacity": ("{}Quantity", "The node's total resources."),
        "allocatable": ("{}Quantity", "The resources pods may use."),
        "phase": ("string", "Deprecated."),
        "conditions": ("[]NodeCondition@type", "The node's current conditions (Ready...)."),
        "addresses": ("[]NodeAddress@type", "The node's addresses."),
        "nodeInfo": ("NodeSystemInfo", "The node's software versions."),
    },
)
core.open("NodeCondition", "One condition of a node.", {"type": "string", "status": "string"})
core.open("NodeAddress", "One address of a node.", {"type": "string", "address": "string"})
core.open(
    "NodeSystemInfo",
    "Versions and identifiers reported by a node.",
    {
        "kubeletVersion": "string",
        "osImage": "string",
        "kernelVersion": "string",
        "containerRuntimeVersion": "string",
    },
)
core.struct(
    "Namespace",
    "A scope for names.",
    {
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _METADATA,
        "spec": ("NamespaceSpec", "What the namespace's deletion waits for."),
        "status": ("NamespaceStatus", "The namespace's lifecycle phase."),
    },
    gvk=("", "v1", "Namespace"),
)
core.struct(
    "NamespaceSpec",
    "The desired state of a namespace.",
    {"finalizers": ("[]string", "What must happen before the namespace is removed.")},
)
core.open("NamespaceStatus", "The observed state of a namespace.", {"phase": "string"})
core.struct(
    "ResourceQuota",
    "Limits on the aggregate resource use in a namespace.",
    {
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _METADATA,
        "spec": ("ResourceQuotaSpec", "The enforced limits."),
        "status": ("ResourceQuotaStatus", "The enforced limits and what is used."),
    },
    gvk=("", "v1", "ResourceQuota"),
)
core.struct(
    "ResourceQuotaSpec",
    "The limits a quota enforces.",
    {
        "hard": ("{}Quantity", "The most of each named resource the namespace may use."),
        "scopes": ("[]string", "The object scopes the quota counts."),
        "scopeSelector": ("ScopeSelector", "A selector of the scopes the quota counts."),
    },
)
core.open("ScopeSelector", "A selector of quota scopes.")
core.struct(
    "ResourceQuotaStatus",
    "What a quota enforces and what is used.",
    {
        "hard": ("{}Quantity", "The enforced limits."),
        "used": ("{}Quantity", "What the namespace uses now."),
    },
)
core.struct(
    "ConfigMap",
    "Configuration data for pods to consume.",
    {
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _METADATA,
        "data": ("{}string", "UTF-8 values by key."),
        "binaryData": ("{}byte", "Binary values by key (base64 on the wire)."),
        "immutable": ("boolean", "Whether the data may no longer change."),
    },
    gvk=("", "v1", "ConfigMap"),
)

# --- bindings and events ---------------------------------------------------------------------

core.struct(
    "Binding",
    "Binds a pod to a node (what a scheduler posts to pods/binding).",
    {
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _METADATA,
        "target": ("ObjectReference", "The node to bind to."),
    },
    required=("target",),
    gvk=("", "v1", "Binding"),
)
core.struct(
    "ObjectReference",
    "A reference to another object.",
    {
        "kind": "string",
        "namespace": "string",
        "name": "string",
        "uid": "string",
        "apiVersion": "string",
        "resourceVersion": "string",
        "fieldPath": ("string", "A part of the object, such as spec.containers{name}."),
    },
)
core.struct(
    "EventSource",
    "The component that reported an event.",
    {"component": "string", "host": "string"},
)
core.struct(
    "EventSeries",
    "A series of repeated events.",
    {"count": "int32", "lastObservedTime": "meta.MicroTime"},
)
core.struct(
    "Event",
    "A report of something that happened to an object.",
    {
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _METADATA,
        "involvedObject": ("ObjectReference", "The object the event is about."),
        "reason": ("string", "Why it happened, short and in CamelCase."),
        "message": ("string", "What happened, for people."),
        "source": ("EventSource", "The component that reported it."),
        "firstTimestamp": ("Time", "When it was first seen."),
        "lastTimestamp": ("Time", "When it was last seen."),
        "count": ("int32", "How often it happened."),
        "type": ("string", "Normal or Warning."),
        "eventTime": ("meta.MicroTime", "When it first happened (new-style events)."),
        "series": ("EventSeries", "The series it belongs to, if repeated."),
        "action": ("string", "What was done (or failed)."),
        "related": ("ObjectReference", "A second object involved."),
        "reportingComponent": ("string", "The controller that emitted it."),
        "reportingInstance": ("string", "The instance of that controller."),
    },
    required=("metadata", "involvedObject"),
    gvk=("", "v1", "Event"),
)
events.struct(
    "Event",
    "A report of something that happened to an object.",
    {
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _METADATA,
        "eventTime": ("meta.MicroTime", "When it first happened."),
        "series": ("EventSeries", "The series it belongs to, if repeated."),
        "reportingController": ("string", "The controller that emitted it."),
        "reportingInstance": ("string", "The instance of that controller."),
        "action": ("string", "What was done (or failed)."),
        "reason": ("string", "Why it happened, short and in CamelCase."),
        "regarding": ("core.ObjectReference", "The object the event is about."),
        "related": ("core.ObjectReference", "A second object involved."),
        "note": ("string", "What happened, for people."),
        "type": ("string", "Normal or Warning."),
        "deprecatedSource": ("core.EventSource", "The core/v1 source field."),
        "deprecatedFirstTimestamp": ("meta.Time", "The core/v1 firstTimestamp field."),
        "deprecatedLastTimestamp": ("meta.Time", "The core/v1 lastTimestamp field."),
        "deprecatedCount": ("int32", "The core/v1 count field."),
    },
    required=("eventTime",),
    gvk=("events.k8s.io", "v1", "Event"),
)
events.struct(
    "EventSeries",
    "A series of repeated events.",
    {"count": "int32", "lastObservedTime": "meta.MicroTime"},
    required=("count", "lastObservedTime"),
)

# --- NodeResourceTopology (a CRD upstream: its schema is its only validation) -----------------

nrt.struct(
    "NodeResourceTopology",
    "The NUMA zones of a node and the resources available in each.",
    {
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _METADATA,
        "topologyPolicies": ("[]string", "Deprecated: the node's topology manager policy."),
        "zones": ("[]Zone", "The node's zones (NUMA nodes)."),
        "attributes": ("[]AttributeInfo", "Node-wide attributes (topologyManagerPolicy...)."),
    },
    required=("zones",),
    gvk=("topology.node.k8s.io", "v1alpha2", "NodeResourceTopology"),
)
nrt.struct(
    "Zone",
    "One topology zone, such as a NUMA node.",
    {
        "name": ("string", "The zone's name, such as node-0."),
        "type": ("string", "The zone's kind, such as Node."),
        "parent": ("string", "The enclosing zone, if any."),
        "costs": ("[]CostInfo", "Distances to the other zones."),
        "attributes": ("[]AttributeInfo", "Attributes of the zone."),
        "resources": ("[]ResourceInfo", "The resources in the zone."),
    },
    required=("name", "type"),
)
nrt.struct(
    "CostInfo",
    "The distance to another zone.",
    {"name": "string", "value": "int64"},
    required=("name", "value"),
)
nrt.struct(
    "AttributeInfo",
    "A named attribute.",
    {"name": "string", "value": "string"},
    required=("name", "value"),
)
nrt.struct(
    "ResourceInfo",
    "The amounts of one resource in a zone.",
    {
        "name": ("string", "The resource's name (cpu, memory, nvidia.com/gpu...)."),
        "capacity": ("resource.Quantity", "All of it."),
        "allocatable": ("resource.Quantity", "What pods may use."),
        "available": ("resource.Quantity", "What is not in use."),
    },
    required=("name", "capacity", "allocatable", "available"),
)

CATALOG.finish()
