"""The top-level keys of a KubeletConfiguration (kubelet.config.k8s.io/v1beta1) that nri-numa
has no use for, so that a kubelet's own config file can be handed to it as it is.

Taken from the json names of the KubeletConfiguration type in Kubernetes'
staging/src/k8s.io/kubelet/config/v1beta1/types.go, checked against Kubernetes 1.36.3
(k8s.io/kubelet v0.36.3: 125 keys; 1.33 added imagePullCredentialsVerificationPolicy,
mergeDefaultEvictionSettings, preloadedImagesVerificationAllowlist and userNamespaces, 1.36
memoryReservationPolicy and tlsCurvePreferences), plus defaultPodSysctls of the master after
1.36. The keys nri-numa reads are not here: nri_numa.engine.config_reader owns those. A key in
neither list is a typo or a newer kubelet's key, and is refused with the nearest name.
"""

from __future__ import annotations

IGNORED_KUBELET_KEYS = frozenset({
    # serving, TLS, authentication
    "enableServer", "address", "port", "readOnlyPort", "tlsCertFile", "tlsPrivateKeyFile",
    "tlsCipherSuites", "tlsCurvePreferences", "tlsMinVersion", "rotateCertificates",
    "serverTLSBootstrap", "authentication", "authorization", "healthzPort",
    "healthzBindAddress", "enableDebuggingHandlers", "enableContentionProfiling",
    "enableSystemLogHandler", "enableSystemLogQuery", "enableProfilingHandler",
    "enableDebugFlagsHandler",
    # pods, sources and sync
    "staticPodPath", "podLogsDir", "syncFrequency", "fileCheckFrequency", "httpCheckFrequency",
    "staticPodURL", "staticPodURLHeader", "maxPods", "podsPerCore", "podCIDR", "podPidsLimit",
    "runOnce", "registerNode", "registerWithTaints", "providerID", "crashLoopBackOff",
    "userNamespaces",
    # images
    "registryPullQPS", "registryBurst", "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist", "imageMinimumGCAge", "imageMaximumGCAge",
    "imageGCHighThresholdPercent", "imageGCLowThresholdPercent", "serializeImagePulls",
    "maxParallelImagePulls", "nodeStatusMaxImages",
    # API server, events, node status
    "eventRecordQPS", "eventBurst", "kubeAPIQPS", "kubeAPIBurst", "contentType",
    "nodeStatusUpdateFrequency", "nodeStatusReportFrequency", "nodeLeaseDurationSeconds",
    # DNS and networking
    "clusterDomain", "clusterDNS", "resolvConf", "hairpinMode", "makeIPTablesUtilChains",
    "iptablesMasqueradeBit", "iptablesDropBit", "allowedUnsafeSysctls", "defaultPodSysctls",
    "streamingConnectionIdleTimeout",
    # cgroups, QoS and the managers nri-numa does not stand in for
    "kubeletCgroups", "systemCgroups", "cgroupRoot", "cgroupsPerQOS", "cgroupDriver",
    "singleProcessOOMKill", "qosReserved", "cpuCFSQuota",
    "cpuCFSQuotaPeriod", "systemReservedCgroup", "kubeReservedCgroup", "enforceNodeAllocatable",
    "memoryThrottlingFactor", "memoryReservationPolicy", "memorySwap", "failSwapOn",
    "failCgroupV1", "localStorageCapacityIsolation", "oomScoreAdj", "maxOpenFiles",
    "protectKernelDefaults", "kernelMemcgNotification",
    # eviction and shutdown
    "evictionHard", "evictionSoft", "evictionSoftGracePeriod",
    "evictionPressureTransitionPeriod", "evictionMaxPodGracePeriod", "evictionMinimumReclaim",
    "mergeDefaultEvictionSettings", "shutdownGracePeriod", "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    # logs, runtime, volumes, features, observability
    "containerLogMaxSize", "containerLogMaxFiles", "containerLogMaxWorkers",
    "containerLogMonitorInterval", "configMapAndSecretChangeDetectionStrategy",
    "runtimeRequestTimeout", "containerRuntimeEndpoint", "imageServiceEndpoint",
    "volumePluginDir", "volumeStatsAggPeriod", "enableControllerAttachDetach", "featureGates",
    "showHiddenMetricsForVersion", "logging", "tracing", "seccompDefault",
})
