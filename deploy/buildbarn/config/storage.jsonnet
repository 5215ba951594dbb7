// bb-storage: the CAS and the action cache, and the frontend clients talk to (port 8980):
// Execute calls are forwarded to bb-scheduler.
local common = import 'common.libsonnet';

{
  grpcServers: [{
    listenAddresses: [':8980'],
    authenticationPolicy: common.allowAll,
  }],
  maximumMessageSizeBytes: common.maximumMessageSizeBytes,
  contentAddressableStorage: {
    backend: common.localBackend('/storage/cas', 256 * 1024 * 1024, 32 * 1024 * 1024 * 1024),
    getAuthorizer: common.allowAll,
    putAuthorizer: common.allowAll,
    findMissingAuthorizer: common.allowAll,
  },
  actionCache: {
    // An action-cache entry is served only while every output it names is still in the CAS.
    backend: {
      completenessChecking: {
        backend: common.localBackend('/storage/ac', 16 * 1024 * 1024, 256 * 1024 * 1024),
        maximumTotalTreeSizeBytes: 64 * 1024 * 1024,
      },
    },
    getAuthorizer: common.allowAll,
    putAuthorizer: common.allowAll,
  },
  schedulers: {
    [common.instanceNamePrefix]: {
      endpoint: { address: common.schedulerClientAddress },
    },
  },
  executeAuthorizer: common.allowAll,
}
