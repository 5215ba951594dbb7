// bb-worker: fetches each action's inputs into /worker/build (hard links from its file cache
// in /worker/cache) and asks bb-runner, over the socket /worker/runner, to run the command.
local common = import 'common.libsonnet';

{
  blobstore: common.blobstore,
  maximumMessageSizeBytes: common.maximumMessageSizeBytes,
  scheduler: { address: common.schedulerWorkerAddress },
  buildDirectories: [{
    native: {
      buildDirectoryPath: '/worker/build',
      cacheDirectoryPath: '/worker/cache',
      // The cache keeps input files between actions: an uploaded compiler (upload mode) is
      // fetched once per worker, then hard-linked into every action.
      maximumCacheFileCount: 100000,
      maximumCacheSizeBytes: 8 * 1024 * 1024 * 1024,
      cacheReplacementPolicy: 'LEAST_RECENTLY_USED',
    },
    runners: [{
      endpoint: { address: 'unix:///worker/runner' },
      // Actions at once on this worker: one per core of the host (one ThinLTO backend compile
      // keeps one core busy), from BB_WORKER_CONCURRENCY (docker-compose.yml passes it on).
      concurrency: std.parseInt(std.extVar('BB_WORKER_CONCURRENCY')),
      instanceNamePrefix: common.instanceNamePrefix,
      platform: { properties: common.platformProperties },
      workerId: { host: 'worker-0' },
    }],
  }],
  outputUploadConcurrency: 11,
  directoryCache: {
    maximumCount: 1000,
    maximumSizeBytes: 1000 * 1024,
    cacheReplacementPolicy: 'LEAST_RECENTLY_USED',
  },
}
