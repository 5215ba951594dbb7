// bb-scheduler: queues Execute calls from the frontend (8982), hands them to workers (8983),
// and shows its queues on a web page (7982).
local common = import 'common.libsonnet';

{
  adminHttpServers: [{
    listenAddresses: [':7982'],
    authenticationPolicy: common.allowAll,
  }],
  clientGrpcServers: [{
    listenAddresses: [':8982'],
    authenticationPolicy: common.allowAll,
  }],
  workerGrpcServers: [{
    listenAddresses: [':8983'],
    authenticationPolicy: common.allowAll,
  }],
  contentAddressableStorage: common.blobstore.contentAddressableStorage,
  maximumMessageSizeBytes: common.maximumMessageSizeBytes,
  executeAuthorizer: common.allowAll,
  modifyDrainsAuthorizer: common.allowAll,
  killOperationsAuthorizer: common.allowAll,
  actionRouter: {
    simple: {
      platformKeyExtractor: { actionAndCommand: {} },
      // dtlto-reapi sends one tool_invocation_id per link and --invocation-id as the
      // correlated invocations ID: the scheduler shares workers fairly between them.
      invocationKeyExtractors: [
        { correlatedInvocationsId: {} },
        { toolInvocationId: {} },
      ],
      initialSizeClassAnalyzer: {
        defaultExecutionTimeout: '600s',
        maximumExecutionTimeout: '3600s',
      },
    },
  },
  // An action whose platform no worker offers fails after this long instead of waiting forever.
  platformQueueWithNoWorkersTimeout: '120s',
}
