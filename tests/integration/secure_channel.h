// A raw gRPC channel to a TLS coordinator for tests that play a client the CLI would not be
// (no token, a forged worker, a second session): header-only, because the cluster harness
// (cluster.h) stays free of gRPC.
#ifndef STEMMA_TESTS_INTEGRATION_SECURE_CHANNEL_H_
#define STEMMA_TESTS_INTEGRATION_SECURE_CHANNEL_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/rpc.h"

namespace stemma::testing {

// A channel that trusts `ca` and shares no subchannel with other channels of the process (so
// each one is its own connection, as two processes' would be).
inline std::shared_ptr<grpc::Channel> OpenChannel(const std::string& address,
                                                  const std::string& ca) {
  ClientSecurity s;
  s.ca_file = ca;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto creds = MakeChannelCredentials(s, &args);
  EXPECT_TRUE(creds.ok()) << creds.status();
  return grpc::CreateCustomChannel(address, *creds, args);
}

}  // namespace stemma::testing

#endif  // STEMMA_TESTS_INTEGRATION_SECURE_CHANNEL_H_
