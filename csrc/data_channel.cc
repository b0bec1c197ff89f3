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

Call::~Call() {
  if (started_ && !done_) {  // a call given up on (an error on the waiter's side)
    context_.TryCancel();
    wait();
  }
  queue_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue_.Next(&tag, &ok)) {
  }
}

bool Call::wait_for(std::chrono::milliseconds wait) {
  if (done_) return true;
  void* tag = nullptr;
  bool ok = false;
  const auto deadline = std::chrono::system_clock::now() + wait;
  // Finish is the only operation on the queue: its tag is the call's one event.
  if (queue_.AsyncNext(&tag, &ok, deadline) == grpc::CompletionQueue::GOT_EVENT) done_ = true;
  return done_;
}

void Call::wait() {
  while (!wait_for(std::chrono::milliseconds(1000))) {
  }
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

void DataChannel::start(Call& call, const std::string& method) {
  std::lock_guard<std::mutex> guard(lock_);
  if (!stub_) throw std::runtime_error("the channel to this PS node is closed");
  call.reader_ = stub_->PrepareUnaryCall(&call.context_, method, call.request_, &call.queue_);
  call.reader_->StartCall();
  call.reader_->Finish(&call.reply_, &call.status_, &call);
  call.started_ = true;
}

bool DataChannel::unreachable() {
  std::lock_guard<std::mutex> guard(lock_);
  return channel_ && channel_->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE;
}

void DataChannel::close() {
  std::lock_guard<std::mutex> guard(lock_);
  stub_.reset();
  channel_.reset();
}

}  // namespace recstore::rpc
