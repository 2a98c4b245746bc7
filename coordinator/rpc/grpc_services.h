// gRPC adapters: translate the wire to the domain interfaces in service_interfaces.h.
// The only coordinator code that includes grpcpp. Errors are converted in one place
// (common/rpc.h); every call passes the Authenticator first.
#pragma once

#include <memory>
#include <string>

#include "common/rpc.h"
#include "coordinator/metrics.h"
#include "coordinator/service_interfaces.h"
#include "stemma/v1/user_service.grpc.pb.h"
#include "stemma/v1/worker_service.grpc.pb.h"

namespace stemma::coordinator {

// Builds the user and worker services over the handlers. Does not own them.
std::unique_ptr<v1::UserService::Service> MakeUserService(UserHandler* handler,
                                                          const Authenticator* auth,
                                                          CoordinatorMetrics* metrics);
std::unique_ptr<v1::WorkerService::Service> MakeWorkerService(WorkerHandler* handler,
                                                              const Authenticator* auth,
                                                              CoordinatorMetrics* metrics);

}  // namespace stemma::coordinator
