// Shared by storage.jsonnet, scheduler.jsonnet and worker.jsonnet (the layout of upstream
// bb-deployments, reduced to one storage node that is also the clients' frontend).
{
  // Clients, the scheduler and the workers all reach the CAS and the action cache here.
  storageAddress: 'storage:8980',
  // The scheduler's port for the frontend (Execute) and the one for the workers.
  schedulerClientAddress: 'scheduler:8982',
  schedulerWorkerAddress: 'scheduler:8983',
  // Actions are routed to workers by instance name prefix and platform: clients pass
  // --instance-name=dtlto --platform=OSFamily=Linux, exactly the properties below.
  instanceNamePrefix: 'dtlto',
  platformProperties: [
    { name: 'OSFamily', value: 'Linux' },
  ],

  maximumMessageSizeBytes: 16 * 1024 * 1024,

  blobstore: {
    contentAddressableStorage: { grpc: { address: $.storageAddress } },
    actionCache: { grpc: { address: $.storageAddress } },
  },

  // A 'local' block-device backend kept in files under `dir` (which must contain an empty
  // persistent_state/ directory before the first start).
  localBackend(dir, keyMapBytes, blockBytes):: {
    'local': {
      keyLocationMapOnBlockDevice: {
        file: { path: dir + '/key_location_map', sizeBytes: keyMapBytes },
      },
      keyLocationMapMaximumGetAttempts: 8,
      keyLocationMapMaximumPutAttempts: 32,
      oldBlocks: 8,
      currentBlocks: 24,
      newBlocks: 3,
      blocksOnBlockDevice: {
        source: { file: { path: dir + '/blocks', sizeBytes: blockBytes } },
        spareBlocks: 3,
      },
      persistent: {
        stateDirectoryPath: dir + '/persistent_state',
        minimumEpochInterval: '300s',
      },
    },
  },

  allowAll: { allow: {} },
}
