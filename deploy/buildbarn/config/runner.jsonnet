// bb-runner: runs inside the container whose image actions see (docker-compose.yml, service
// "runner"); bb-worker connects to it over /worker/runner.
{
  buildDirectoryPath: '/worker/build',
  grpcServers: [{
    listenPaths: ['/worker/runner'],
    authenticationPolicy: { allow: {} },
  }],
}
