#include "train/image_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>

#include "core/input_file.h"
#include "core/philox.h"

namespace hap::train {

namespace fs = std::filesystem;

CifarRecords read_cifar(const std::vector<std::string>& files, std::int64_t num_classes) {
  CifarRecords r;
  for (const std::string& file : files) {
    std::error_code ec;
    const auto bytes = fs::file_size(file, ec);
    HAP_CHECK(!ec, "data: cannot read CIFAR file ", file, ": ", ec.message());
    HAP_CHECK(bytes > 0 && bytes % kCifarRecordBytes == 0, "data: CIFAR file ", file, " has ",
              bytes, " bytes, not a whole number of ", kCifarRecordBytes,
              "-byte records (1 label byte + 3072 pixel bytes)");
    std::ifstream in(file, std::ios::binary);
    HAP_CHECK(in.good(), "data: cannot open CIFAR file ", file);
    const std::int64_t n = static_cast<std::int64_t>(bytes) / kCifarRecordBytes;
    std::vector<std::uint8_t> record(static_cast<size_t>(kCifarRecordBytes));
    r.labels.reserve(r.labels.size() + static_cast<size_t>(n));
    r.pixels.reserve(r.pixels.size() + static_cast<size_t>(n * kCifarImageBytes));
    for (std::int64_t i = 0; i < n; ++i) {
      in.read(reinterpret_cast<char*>(record.data()), kCifarRecordBytes);
      HAP_CHECK(in.good(), "data: CIFAR file ", file, ": read failed at record ", i);
      HAP_CHECK(record[0] < num_classes, "data: CIFAR file ", file, ": record ", i,
                " (byte offset ", i * kCifarRecordBytes, ") has label ",
                static_cast<int>(record[0]), ", expected a class in [0, ", num_classes, ")");
      r.labels.push_back(record[0]);
      r.pixels.insert(r.pixels.end(), record.begin() + 1, record.end());
    }
  }
  return r;
}

namespace {

constexpr float kCifarMean[3] = {0.4914f, 0.4822f, 0.4465f};
constexpr float kCifarStd[3] = {0.2470f, 0.2435f, 0.2616f};
constexpr std::int64_t kCropPadding = 4;
constexpr double kPi = 3.14159265358979323846;
// Stream families of the counter-based generator, apart from each other and from the models'.
constexpr std::uint64_t kPermutationStreams = std::uint64_t{3} << 60;
constexpr std::uint64_t kAugmentStreams = std::uint64_t{5} << 60;
constexpr std::uint64_t kSyntheticStreams = std::uint64_t{7} << 60;

// What one example is: where it comes from and its label.
struct Geometry {
  std::int64_t channels = 3, height = 32, width = 32, classes = 10, batch = 1;
};

// The model's "images" and "labels" inputs; throws saying what this dataset gives.
Geometry geometry_of(const std::vector<nn::InputSpec>& inputs, bool cifar) {
  std::string needed;
  for (const nn::InputSpec& in : inputs) needed += (needed.empty() ? "" : ", ") + nn::input_str(in);
  const std::string offer =
      std::string(
          "data 'images' gives the inputs images (f32 [batch, C, H, W]) and labels (i64 "
          "[batch], class indices), batch dim 0") +
      (cifar ? " with C, H, W = 3, 32, 32 from CIFAR files" : "") + "; the model needs " + needed;
  HAP_CHECK(inputs.size() == 2, offer);
  const nn::InputSpec *images = nullptr, *labels = nullptr;
  for (const nn::InputSpec& in : inputs) {
    if (in.name == "images") images = &in;
    if (in.name == "labels") labels = &in;
  }
  HAP_CHECK(images && labels, offer);
  HAP_CHECK(images->dtype == DType::F32 && images->shape.size() == 4 && images->batch_dim == 0,
            offer);
  HAP_CHECK(labels->dtype == DType::I64 && labels->shape.size() == 1 && labels->batch_dim == 0 &&
                labels->shape[0] == images->shape[0],
            offer);
  HAP_CHECK(labels->num_classes >= 1, offer, " (labels must declare their number of classes)");
  Geometry g;
  g.batch = images->shape[0];
  g.channels = images->shape[1];
  g.height = images->shape[2];
  g.width = images->shape[3];
  g.classes = labels->num_classes;
  if (cifar)
    HAP_CHECK(g.channels == 3 && g.height == 32 && g.width == 32, offer,
              " (set the model's image size to 32 and its input channels to 3)");
  HAP_CHECK(g.channels >= 1 && g.height >= 1 && g.width >= 1, offer);
  return g;
}

// A file, or a directory's data_batch_*.bin and test_batch.bin.
struct CifarFiles {
  std::vector<std::string> train, val;
};

CifarFiles find_cifar_files(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  HAP_CHECK(!ec && fs::exists(st), "data: path ", path, " does not exist");
  CifarFiles f;
  if (fs::is_regular_file(st)) {
    f.train.push_back(path);
    return f;
  }
  HAP_CHECK(fs::is_directory(st), "data: path ", path, " is neither a file nor a directory");
  for (const std::string& file : regular_files_in(path, "data.path")) {
    const std::string name = fs::path(file).filename().string();
    if (name.rfind("data_batch_", 0) == 0 && name.size() > 4 &&
        name.compare(name.size() - 4, 4, ".bin") == 0)
      f.train.push_back(file);
    if (name == "test_batch.bin") f.val.push_back(file);
  }
  std::sort(f.train.begin(), f.train.end());
  HAP_CHECK(!f.train.empty(), "data: directory ", path,
            " holds no data_batch_*.bin (CIFAR-10 binary training files)");
  return f;
}

// The source of examples of one split: CIFAR records or synthetic patterns.
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  virtual std::int64_t size() const = 0;
  // Example i into `out` [C, H, W] (normalised), returning its label.
  virtual std::int64_t example(std::int64_t i, float* out) const = 0;
};

// Records [begin, end) of a set (the training and held-out validation records share one).
class CifarSource : public ImageSource {
 public:
  CifarSource(std::shared_ptr<const CifarRecords> records, std::int64_t begin, std::int64_t end)
      : records_(std::move(records)), begin_(begin), end_(end) {}
  std::int64_t size() const override { return end_ - begin_; }
  std::int64_t example(std::int64_t i, float* out) const override {
    const std::int64_t at = begin_ + i;
    const std::uint8_t* px = records_->pixels.data() + at * kCifarImageBytes;
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t j = 0; j < 1024; ++j)
        out[c * 1024 + j] =
            (static_cast<float>(px[c * 1024 + j]) / 255.0f - kCifarMean[c]) / kCifarStd[c];
    return records_->labels[static_cast<size_t>(at)];
  }

 private:
  std::shared_ptr<const CifarRecords> records_;
  std::int64_t begin_, end_;
};

// Class k's pattern: amplitude a_c sin(2 pi (fx x / W + fy y / H) + phase_c) in channel c, with
// (fx, fy) from k and (a_c, phase_c) drawn from (seed, k); noise N(0, noise^2) per pixel.
class SyntheticSource : public ImageSource {
 public:
  SyntheticSource(const Geometry& g, std::int64_t size, double noise, std::uint64_t seed,
                  std::uint64_t split_stream)
      : g_(g), size_(size), noise_(noise), seed_(seed), stream_(kSyntheticStreams + split_stream) {}
  std::int64_t size() const override { return size_; }
  std::int64_t example(std::int64_t i, float* out) const override {
    const std::uint64_t id = static_cast<std::uint64_t>(i);
    const std::int64_t k = static_cast<std::int64_t>(philox_words(seed_, stream_, id)[0] %
                                                     static_cast<std::uint32_t>(g_.classes));
    const double fx = 1 + k % 3, fy = 1 + (k / 3) % 4;
    const std::int64_t plane = g_.height * g_.width;
    for (std::int64_t c = 0; c < g_.channels; ++c) {
      const std::uint64_t key = static_cast<std::uint64_t>(k * 64 + c);
      const double amp = 0.5 + philox_uniform(seed_, kSyntheticStreams - 1, 2 * key);
      const double phase = 2 * kPi * philox_uniform(seed_, kSyntheticStreams - 1, 2 * key + 1);
      for (std::int64_t y = 0; y < g_.height; ++y)
        for (std::int64_t x = 0; x < g_.width; ++x) {
          const double arg = 2 * kPi *
                             (fx * static_cast<double>(x) / static_cast<double>(g_.width) +
                              fy * static_cast<double>(y) / static_cast<double>(g_.height));
          const std::uint64_t at =
              (id * static_cast<std::uint64_t>(g_.channels) + static_cast<std::uint64_t>(c)) *
                  static_cast<std::uint64_t>(plane) +
              static_cast<std::uint64_t>(y * g_.width + x);
          const double v =
              amp * std::sin(arg + phase) + noise_ * philox_normal(seed_, stream_ + 1, at);
          out[c * plane + y * g_.width + x] = static_cast<float>(v);
        }
    }
    return k;
  }

 private:
  Geometry g_;
  std::int64_t size_;
  double noise_;
  std::uint64_t seed_, stream_;
};

class ImageDataset : public Dataset {
 public:
  ImageDataset(Geometry g, std::unique_ptr<ImageSource> train, std::unique_ptr<ImageSource> val,
               bool augment, std::uint64_t seed, std::string what)
      : g_(g),
        train_(std::move(train)),
        val_(std::move(val)),
        augment_(augment),
        seed_(seed),
        what_(std::move(what)) {}

  nn::Batch read(Split split, std::uint64_t index, std::int64_t row_begin,
                 std::int64_t row_end) const override {
    const ImageSource& src = split == Split::kTrain ? *train_ : *val_;
    const std::int64_t rows = row_end - row_begin, plane = g_.height * g_.width;
    const std::int64_t per = g_.channels * plane;
    Tensor images = Tensor::empty({rows, g_.channels, g_.height, g_.width});
    Tensor labels = Tensor::empty({rows}, TensorOptions{}.with_dtype(DType::I64));
    float* pi = images.data<float>();
    std::int64_t* pl = labels.data<std::int64_t>();
    std::vector<float> raw(static_cast<size_t>(per));
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t position = static_cast<std::int64_t>(index) * g_.batch + row_begin + r;
      const std::int64_t n = src.size();
      std::int64_t i = position % n;
      if (split == Split::kTrain) i = permutation(position / n)[static_cast<size_t>(i)];
      pl[r] = src.example(i, raw.data());
      float* out = pi + r * per;
      if (split == Split::kTrain && augment_)
        augment(raw.data(), out, static_cast<std::uint64_t>(position));
      else
        std::copy(raw.begin(), raw.end(), out);
    }
    return {{"images", images}, {"labels", labels}};
  }

  std::string describe() const override {
    return what_ + ": " + std::to_string(train_->size()) + " training and " +
           std::to_string(val_->size()) + " validation images of " + std::to_string(g_.channels) +
           "x" + std::to_string(g_.height) + "x" + std::to_string(g_.width) + ", " +
           std::to_string(g_.classes) + " classes" + (augment_ ? ", random crops and flips" : "");
  }

 private:
  // The training split's order in `epoch` (one permutation cached: batches go forward).
  const std::vector<std::int64_t>& permutation(std::int64_t epoch) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (epoch != epoch_) {
      order_.resize(static_cast<size_t>(train_->size()));
      std::iota(order_.begin(), order_.end(), 0);
      for (std::int64_t j = train_->size() - 1; j > 0; --j) {  // Fisher-Yates
        const auto w = philox_words(seed_, kPermutationStreams + static_cast<std::uint64_t>(epoch),
                                    static_cast<std::uint64_t>(j));
        const std::uint64_t draw = (std::uint64_t{w[0]} << 32) | w[1];
        std::swap(order_[static_cast<size_t>(j)],
                  order_[static_cast<size_t>(draw % static_cast<std::uint64_t>(j + 1))]);
      }
      epoch_ = epoch;
    }
    return order_;
  }

  // A random crop of the image padded by kCropPadding zeros on each side, flipped left-right
  // with probability 1/2, drawn from the example's position in the run.
  void augment(const float* in, float* out, std::uint64_t position) const {
    const auto w = philox_words(seed_, kAugmentStreams, position);
    const std::int64_t span = 2 * kCropPadding + 1;
    const std::int64_t dy = static_cast<std::int64_t>(w[0] % span) - kCropPadding;
    const std::int64_t dx = static_cast<std::int64_t>(w[1] % span) - kCropPadding;
    const bool flip = (w[2] & 1u) != 0;
    const std::int64_t H = g_.height, W = g_.width;
    for (std::int64_t c = 0; c < g_.channels; ++c)
      for (std::int64_t y = 0; y < H; ++y)
        for (std::int64_t x = 0; x < W; ++x) {
          const std::int64_t sy = y + dy, sx0 = x + dx, sx = flip ? W - 1 - sx0 : sx0;
          const bool inside = sy >= 0 && sy < H && sx0 >= 0 && sx0 < W;
          out[(c * H + y) * W + x] = inside ? in[(c * H + sy) * W + sx] : 0.0f;
        }
  }

  Geometry g_;
  std::unique_ptr<ImageSource> train_, val_;
  bool augment_;
  std::uint64_t seed_;
  std::string what_;
  mutable std::mutex mutex_;
  mutable std::int64_t epoch_ = -1;
  mutable std::vector<std::int64_t> order_;
};

}  // namespace

DatasetEntry images_dataset_entry() {
  DatasetEntry e;
  e.name = "images";
  e.summary = "labelled images: CIFAR-10 binary files, or synthetic patterns without a path";
  e.options = {
      nn::OptionSpec::string("path", "",
                             "a CIFAR-10 binary file, or a directory of data_batch_*.bin and "
                             "test_batch.bin; empty: synthetic images")
          .empty_allowed(),
      nn::OptionSpec::number("val_fraction", 0.1, 0.0, 1.0,
                             "share of the training records held out when there is no "
                             "test_batch.bin")
          .min_open()
          .max_open(),
      nn::OptionSpec::boolean(
          "augment", false, "random crops (4 pixels of padding) and horizontal flips in training"),
      nn::OptionSpec::integer("synthetic_size", 50000, 1, std::int64_t{1} << 40,
                              "synthetic training images (a fifth as many for validation)"),
      nn::OptionSpec::number("synthetic_noise", 0.5, 0.0, 100.0,
                             "standard deviation of the synthetic images' pixel noise"),
  };
  e.open = [](const nn::Options& o, const std::vector<nn::InputSpec>& inputs,
              std::uint64_t seed) -> std::shared_ptr<Dataset> {
    const std::string& path = o.string("path");
    const Geometry g = geometry_of(inputs, !path.empty());
    const bool augment = o.boolean("augment");
    if (path.empty()) {
      const std::int64_t n = o.integer("synthetic_size");
      const double noise = o.number("synthetic_noise");
      return std::make_shared<ImageDataset>(
          g, std::make_unique<SyntheticSource>(g, n, noise, seed, 0),
          std::make_unique<SyntheticSource>(g, std::max<std::int64_t>(n / 5, 1), noise, seed, 2),
          augment, seed,
          "images: synthetic (class patterns + noise " + std::to_string(noise).substr(0, 4) + ")");
    }
    const CifarFiles files = find_cifar_files(path);
    auto train = std::make_shared<const CifarRecords>(read_cifar(files.train, g.classes));
    std::unique_ptr<ImageSource> val_source;
    std::int64_t train_end = train->size();
    if (!files.val.empty()) {
      auto val = std::make_shared<const CifarRecords>(read_cifar(files.val, g.classes));
      const std::int64_t n = val->size();
      val_source = std::make_unique<CifarSource>(std::move(val), 0, n);
    } else {
      const double fraction = o.number("val_fraction");
      const auto held =
          static_cast<std::int64_t>(std::floor(static_cast<double>(train->size()) * fraction));
      HAP_CHECK(held >= 1 && held < train->size(), "data: ", path, " holds ", train->size(),
                " CIFAR records: too few to hold out data.val_fraction = ", fraction,
                " of them for validation and keep the rest for training");
      train_end = train->size() - held;
      val_source = std::make_unique<CifarSource>(train, train_end, train->size());
    }
    const std::int64_t files_read =
        static_cast<std::int64_t>(files.train.size() + files.val.size());
    return std::make_shared<ImageDataset>(
        g, std::make_unique<CifarSource>(train, 0, train_end), std::move(val_source), augment, seed,
        "images: CIFAR-10 " + path + " (" + std::to_string(files_read) + " file(s))");
  };
  return e;
}

}  // namespace hap::train
