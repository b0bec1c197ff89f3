#include "data_channel.h"

#include <stdexcept>

namespace recstore::rpc {

Call::Call(grpc::ByteBuffer request, double timeout_s, bool wait_for_ready,
           const Metadata& metadata)
    : request_(std::move(request)) {
  if (timeout_s > 0) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(
                              std::chrono::duration<double>(timeout_s)));
  }
  context_.set_wait_for_ready(wait_for_ready);
  for (const auto& [key, value] : metadata) context_.AddMetadata(key, value);
}

void Call::finish(grpc::Status status) {
  std::lock_guard<std::mutex> guard(lock_);
  status_ = std::move(status);
  done_ = true;
  finished_.notify_all();
}

bool Call::wait_for(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> guard(lock_);
  return finished_.wait_for(guard, wait, [this] { return done_; });
}

void Call::wait() {
  std::unique_lock<std::mutex> guard(lock_);
  finished_.wait(guard, [this] { return done_; });
}

Metadata Call::trailing() const {
  Metadata out;
  for (const auto& [key, value] : context_.GetServerTrailingMetadata()) {
    out.emplace_back(std::string(key.data(), key.size()), std::string(value.data(), value.size()));
  }
  return out;
}

DataChannel::DataChannel(const std::string& target, const std::vector<ChannelArg>& args,
                         const TlsPems* tls) {
  grpc::ChannelArguments arguments;
  for (const ChannelArg& arg : args) {
    if (arg.is_int) {
      arguments.SetInt(arg.name, static_cast<int>(arg.number));
    } else {
      arguments.SetString(arg.name, arg.text);
    }
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls == nullptr) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = tls->ca;
    options.pem_private_key = tls->key;
    options.pem_cert_chain = tls->cert;
    credentials = grpc::SslCredentials(options);
  }
  channel_ = grpc::CreateCustomChannel(target, credentials, arguments);
  stub_ = std::make_unique<grpc::GenericStub>(channel_);
}

void DataChannel::start(const std::shared_ptr<Call>& call, const std::string& method) {
  std::lock_guard<std::mutex> guard(lock_);
  if (!stub_) throw std::runtime_error("the channel to this PS node is closed");
  Call* raw = call.get();
  stub_->UnaryCall(&raw->context_, method, grpc::StubOptions(), &raw->request_, &raw->reply_,
                   [call](grpc::Status status) { call->finish(std::move(status)); });
}

void DataChannel::close() {
  std::lock_guard<std::mutex> guard(lock_);
  stub_.reset();
  channel_.reset();
}

}  // namespace recstore::rpc
