import torch
from recstore.KVClient import RecStoreClient

# 初始化客户端
client = RecStoreClient()

# 初始化嵌入表
client.init_data(
    "user_embedding",
    (100000, 64),
    torch.float32,
    init_func=lambda shape, dtype: torch.randn(shape, dtype=dtype) * 0.01
)

# 读取嵌入
ids = torch.tensor([1, 2, 3], dtype=torch.int64)
embeddings = client.pull("user_embedding", ids)  # [3, 64]

# 异步预取
prefetch_id = client.prefetch(ids)
# ... 执行其他计算 ...
result = client.wait_for_prefetch(prefetch_id)  # [3, 64]

# 更新梯度
grads = torch.randn(3, 64, dtype=torch.float32)
client.update("user_embedding", ids, grads)
