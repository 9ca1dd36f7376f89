# The seed guide's `tpu_mnist.py` (section 3.3), extracted for the side-by-side benchmark.
# The guide's text lost its quotes and `=` signs in extraction; they are restored, nothing else is
# changed (comments translated in brackets). Run it through benchmarks/seed_harness.py, which supplies
# the data offline and sets the epochs; see that file for the three things it changes and why.
# ruff: noqa
# pyright: reportMissingImports=false, reportCallIssue=false, reportMissingModuleSource=false
# fmt: off
# tpu_mnist.py
import os
import tensorflow as tf
import time
from cloud_tpu_client import Client

# 1. 检测并初始化TPU [detect and initialise the TPU]
try:
    # 尝试连接到TPU集群 [try to connect to the TPU cluster]
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    print("Running on TPU ", resolver.master())
except ValueError:
    # 如果不在TPU环境则回退到CPU/GPU [not on a TPU: fall back to CPU/GPU]
    strategy = tf.distribute.get_strategy()
    print("Running on CPU/GPU")

# 2. 加载MNIST数据集 [load MNIST]
(x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()
# 归一化并重塑数据 [normalise and reshape]
x_train, x_test = x_train / 255.0, x_test / 255.0
x_train = x_train[..., tf.newaxis].astype("float32")
x_test = x_test[..., tf.newaxis].astype("float32")

# 创建TensorFlow数据集 [tf.data datasets]
train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(10000).batch(256)
test_dataset = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(256)

# 3. 在strategy.scope()内定义模型 [define the model inside strategy.scope()]
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10)  # 输出10个类别 [10 classes out]
    ])
    model.compile(
        optimizer=tf.keras.optimizers.Adam(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"]
    )

# 4. 训练模型 [train]
print("开始训练...")
start_time = time.time()
history = model.fit(train_dataset, epochs=5, validation_data=test_dataset)
end_time = time.time()
print(f"训练完成耗时{end_time - start_time:.2f}秒")
print(f"最终测试准确率{history.history['val_accuracy'][-1]:.4f}")

# 5. (可选)保存模型到Cloud Storage [optional: save the model to Cloud Storage]
# 需要先配置好gsutil和认证
# model.save("gs://your-bucket-name/path/to/model")
