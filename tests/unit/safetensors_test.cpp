// Safetensors reader tests: files written by a small writer (safetensors_test_util.h)
// read back with values, shapes, dtypes and metadata; sharded checkpoints and
// folder resolution; GGUF keeping quern-only types out; interop with the Python
// `safetensors` package when installed; the inspect report. The malformed-input
// suite is safetensors_malformed_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "formats/safetensors_inspect.h"
#include "safetensors_test_util.h"

using namespace quern;
using namespace st_test;

namespace {

// ---------------------------------------------------------------- reading

TEST(Safetensors, DTypeTable) {
    EXPECT_EQ(safetensors_supported_dtypes(), "F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL");
    for (const char* n : {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32", "I16", "I8", "U8", "BOOL"}) {
        const SafetensorsDType* d = safetensors_dtype(n);
        ASSERT_NE(d, nullptr) << n;
        EXPECT_EQ(dtype_name(d->type), n);  // quern's DType has the same name
        EXPECT_EQ(dtype_info(d->type).type_size, d->size) << n;
        EXPECT_EQ(dtype_info(d->type).block_size, 1) << n;
    }
    EXPECT_EQ(safetensors_dtype("bf16"), nullptr);  // case-sensitive, as the format
    EXPECT_EQ(safetensors_dtype("U16"), nullptr);
}

TEST(Safetensors, ReadsValuesShapesDtypesMetadata) {
    const Writer w = sample();
    const std::string path = w.write("sample.safetensors");
    const SafetensorsFile f(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.header_size() % 8, 0u);
    EXPECT_EQ(f.data_offset(), 8 + f.header_size());
    ASSERT_EQ(f.metadata().size(), 2u);
    EXPECT_EQ(f.metadata()[0], (std::pair<std::string, std::string>{"format", "pt"}));
    EXPECT_EQ(f.metadata_value("note"), "quern test \"quoted\"");
    EXPECT_EQ(f.metadata_value("absent"), std::nullopt);
    ASSERT_EQ(f.tensors().size(), w.tensors.size());

    // Listed in data order: the reverse of the header's.
    EXPECT_EQ(f.tensors().front().name, "conv");
    EXPECT_EQ(f.tensors().back().name, "model.layers.0.w");
    for (size_t i = 1; i < f.tensors().size(); ++i)
        EXPECT_EQ(f.tensors()[i].offset, f.tensors()[i - 1].offset + f.tensors()[i - 1].nbytes);

    for (const auto& wt : w.tensors) {
        SCOPED_TRACE(wt.name);
        const SafetensorsTensorInfo* t = f.find_tensor(wt.name);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->dtype, wt.dtype);
        EXPECT_EQ(t->type, safetensors_dtype(wt.dtype)->type);
        EXPECT_EQ(t->shape, wt.shape);
        EXPECT_EQ(t->nbytes, wt.bytes.size());
        uint64_t numel = 1;
        for (int64_t d : wt.shape) numel *= static_cast<uint64_t>(d);
        EXPECT_EQ(t->numel, numel);
        ASSERT_LE(t->offset + t->nbytes, f.file_size());
        if (!wt.bytes.empty()) EXPECT_EQ(std::memcmp(f.data(*t), wt.bytes.data(), wt.bytes.size()), 0);
    }
    EXPECT_EQ(f.find_tensor("nope"), nullptr);

    // Views: ne is the stored shape reversed, nb contiguous strides.
    const Tensor v = f.tensor_view(*f.find_tensor("model.layers.0.w"));
    EXPECT_EQ(v.name, "model.layers.0.w");
    EXPECT_EQ(v.type, DType::F32);
    EXPECT_EQ(v.ne, (std::array<int64_t, 4>{3, 2, 1, 1}));
    EXPECT_EQ(v.nb, (std::array<size_t, 4>{4, 12, 24, 24}));
    EXPECT_EQ(load<float>(v.row(1), 2), 6.0f);
    const Tensor h = f.tensor_view(*f.find_tensor("h"));
    EXPECT_EQ(h.ne, (std::array<int64_t, 4>{2, 1, 2, 1}));
    EXPECT_EQ(h.nb, (std::array<size_t, 4>{2, 4, 4, 8}));
    EXPECT_EQ(load<uint16_t>(h.row(0, 1), 1), 0x7c00);
    const Tensor i32 = f.tensor_view(*f.find_tensor("i32"));
    EXPECT_EQ(i32.ne, (std::array<int64_t, 4>{2, 1, 1, 1}));
    EXPECT_EQ(i32.nbytes(), 8u);
    const Tensor d = f.tensor_view(*f.find_tensor("d"));  // scalar
    EXPECT_EQ(d.ne, (std::array<int64_t, 4>{1, 1, 1, 1}));
    EXPECT_EQ(load<double>(d.data), 3.5);
    EXPECT_EQ(f.find_tensor("d")->numel, 1u);
    const Tensor e = f.tensor_view(*f.find_tensor("empty"));
    EXPECT_EQ(e.ne, (std::array<int64_t, 4>{5, 0, 1, 1}));
    EXPECT_EQ(e.nelements(), 0);
    EXPECT_EQ(f.tensor_view(*f.find_tensor("e4m3")).type, DType::F8_E4M3);
    EXPECT_EQ(f.tensor_view(*f.find_tensor("mask")).type, DType::BOOL);
    try {
        f.tensor_view(*f.find_tensor("conv"));
        ADD_FAILURE() << "a rank-5 view must throw";
    } catch (const Error& err) {
        EXPECT_ERROR(std::string(err.what()), "'conv'", "5 dimensions", "[1, 2, 1, 1, 2]");
    }
}

TEST(Safetensors, EmptyFileAndPaddingAndNullMetadata) {
    EXPECT_EQ(load_error(raw_file("{}", {})), "");
    EXPECT_EQ(load_error(raw_file("{}      ", {})), "");
    EXPECT_EQ(load_error(raw_file(R"({"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                                  {1, 2})),
              "");
    // Zero-size tensors may sit at any boundary of the buffer.
    EXPECT_EQ(load_error(raw_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},
                                      "z":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},
                                      "y":{"dtype":"F32","shape":[3,0],"data_offsets":[0,0]}})",
                                  {1, 2})),
              "");
}

// ---------------------------------------------------------------- sharded checkpoints

TEST(SafetensorsModel, ShardedIndex) {
    const Sharded s = write_sharded("sharded");
    for (const std::string& path : {s.dir, s.dir + "/model.safetensors.index.json"}) {
        SCOPED_TRACE(path);
        const SafetensorsModel m = SafetensorsModel::open(path);
        EXPECT_EQ(m.index_path(), s.dir + "/model.safetensors.index.json");
        EXPECT_EQ(OJson::parse(m.index_metadata_json())["total_size"], 32);
        ASSERT_EQ(m.files().size(), 2u);
        EXPECT_NE(m.files()[0]->path().find("model-00001-of-00002"), std::string::npos);
        ASSERT_EQ(m.tensors().size(), 4u);
        EXPECT_EQ(m.total_bytes(), 32u);
        EXPECT_EQ(m.tensors()[0].info->name, "embed.weight");
        EXPECT_EQ(m.tensors()[3].info->name, "lm_head.weight");
        const auto* e = m.find("layers.1.w");
        ASSERT_NE(e, nullptr);
        EXPECT_EQ(e->file, m.files()[1].get());
        const Tensor v = m.view("layers.1.w");
        EXPECT_EQ(v.ne, (std::array<int64_t, 4>{2, 1, 1, 1}));
        EXPECT_EQ(load<float>(v.data, 1), 6.0f);
        const Tensor l = m.view("lm_head.weight");
        EXPECT_EQ(l.type, DType::F8_E4M3);
        EXPECT_EQ(static_cast<const uint8_t*>(l.data)[1], 0x40);
        EXPECT_EQ(load<float>(m.view("embed.weight").data, 3), 4.0f);
        EXPECT_EQ(m.find("nope"), nullptr);
        try {
            m.view("nope");
            ADD_FAILURE();
        } catch (const Error& err) {
            EXPECT_ERROR(std::string(err.what()), "'nope'", "model.safetensors.index.json");
        }
    }
}

TEST(SafetensorsModel, FolderResolution) {
    const Writer w = sample();
    // A single model.safetensors (beside other files).
    write_bytes(temp_path("single/model.safetensors"), w.build());
    write_text(temp_path("single/config.json"), "{}");
    const SafetensorsModel m = SafetensorsModel::open(temp_path("single"));
    EXPECT_TRUE(m.index_path().empty());
    EXPECT_EQ(m.index_metadata_json(), "{}");
    ASSERT_EQ(m.files().size(), 1u);
    EXPECT_EQ(m.tensors().size(), w.tensors.size());
    EXPECT_EQ(load<float>(m.view("model.layers.0.w").data, 4), 5.0f);
    // The only .safetensors file of a folder, under another name; a file path.
    write_bytes(temp_path("other/consolidated.safetensors"), w.build());
    EXPECT_EQ(SafetensorsModel::open(temp_path("other")).tensors().size(), w.tensors.size());
    EXPECT_EQ(SafetensorsModel::open(temp_path("other/consolidated.safetensors")).files().size(), 1u);
    // Nothing, several candidates, a missing path.
    fs::create_directories(temp_path("emptydir"));
    EXPECT_ERROR(open_error(temp_path("emptydir")), "emptydir", "no model.safetensors");
    write_bytes(temp_path("two/a.safetensors"), w.build());
    write_bytes(temp_path("two/b.safetensors"), w.build());
    EXPECT_ERROR(open_error(temp_path("two")), "several", "a.safetensors, b.safetensors");
    EXPECT_ERROR(open_error(temp_path("missing")), "missing", "does not exist");
}

// ---------------------------------------------------------------- GGUF keeps to GGML's types

TEST(SafetensorsDTypes, NotInGguf) {
    EXPECT_TRUE(dtype_is_ggml_id(static_cast<uint32_t>(DType::BF16)));
    for (DType t : {DType::U8, DType::BOOL, DType::F8_E4M3, DType::F8_E5M2}) {
        EXPECT_GE(static_cast<uint32_t>(t), kDTypeQuernBase);
        EXPECT_TRUE(dtype_is_known(static_cast<uint32_t>(t)));
        EXPECT_FALSE(dtype_is_ggml_id(static_cast<uint32_t>(t)));
        GgufWriter w;
        const uint8_t data[4] = {};
        EXPECT_THROW(w.add_tensor("x", t, {4, 1, 1, 1}, 1, data), Error);
    }
    // A GGUF file whose tensor claims a quern-only id is rejected by the reader.
    const std::string path = temp_path("t.gguf");
    GgufWriter w;
    const uint8_t data[4] = {1, 2, 3, 4};
    w.add_tensor("tensor_x", DType::I8, {4, 1, 1, 1}, 1, data);
    w.write(path);
    std::vector<uint8_t> b;
    {
        std::ifstream f(path, std::ios::binary);
        b.assign(std::istreambuf_iterator<char>(f), {});
    }
    const std::string name = "tensor_x";
    const auto it = std::search(b.begin(), b.end(), name.begin(), name.end());
    ASSERT_NE(it, b.end());
    const size_t type_at = static_cast<size_t>(it - b.begin()) + name.size() + 4 + 8;  // n_dims, ne[0]
    uint32_t type = 0;
    std::memcpy(&type, &b[type_at], 4);
    ASSERT_EQ(type, static_cast<uint32_t>(DType::I8));
    type = static_cast<uint32_t>(DType::F8_E4M3);
    std::memcpy(&b[type_at], &type, 4);
    write_bytes(path, b);
    try {
        GgufFile g(path);
        ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("unknown tensor type id 1026"), std::string::npos) << e.what();
    }
}

// ---------------------------------------------------------------- interop with Python

bool python_safetensors_available() {
    static const bool ok = std::system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") == 0;
    return ok;
}

TEST(SafetensorsInterop, WeReadPythonFiles) {
    if (!python_safetensors_available()) GTEST_SKIP() << "python3 with the safetensors package is not installed";
    const std::string path = temp_path("from_python.safetensors");
    const std::string script = temp_path("write.py");
    write_text(script, R"(import sys, numpy as np
from safetensors.numpy import save_file
save_file({
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "f16": np.array([1.5, -2.0], dtype=np.float16),
    "i64": np.array([[-5], [7]], dtype=np.int64),
    "u8": np.arange(5, dtype=np.uint8),
    "mask": np.array([True, False, True]),
    "scalar": np.array(2.25, dtype=np.float64),
}, sys.argv[1], metadata={"format": "np", "who": "python"})
)");
    ASSERT_EQ(std::system(("python3 " + script + " " + path).c_str()), 0);
    const SafetensorsFile f(path);
    EXPECT_EQ(f.metadata_value("who"), "python");
    const Tensor a = f.tensor_view(*f.find_tensor("f32"));
    EXPECT_EQ(a.ne, (std::array<int64_t, 4>{3, 2, 1, 1}));
    EXPECT_EQ(load<float>(a.row(1)), 3.0f);
    EXPECT_EQ(f.find_tensor("f16")->dtype, "F16");
    EXPECT_EQ(load<uint16_t>(f.tensor_view(*f.find_tensor("f16")).data), 0x3e00);
    const Tensor i = f.tensor_view(*f.find_tensor("i64"));
    EXPECT_EQ(i.ne, (std::array<int64_t, 4>{1, 2, 1, 1}));
    EXPECT_EQ(load<int64_t>(i.row(0)), -5);
    EXPECT_EQ(load<int64_t>(i.row(1)), 7);
    EXPECT_EQ(static_cast<const uint8_t*>(f.tensor_view(*f.find_tensor("u8")).data)[4], 4);
    EXPECT_EQ(f.find_tensor("mask")->type, DType::BOOL);
    EXPECT_TRUE(f.find_tensor("scalar")->shape.empty());
    EXPECT_EQ(load<double>(f.tensor_view(*f.find_tensor("scalar")).data), 2.25);
}

TEST(SafetensorsInterop, PythonReadsOurFiles) {
    if (!python_safetensors_available()) GTEST_SKIP() << "python3 with the safetensors package is not installed";
    Writer w;
    w.metadata = {{"format", "pt"}};
    w.add<float>("w", "F32", {2, 2}, {1, 2, 3, 4});
    w.add<int16_t>("s", "I16", {3}, {-1, 0, 1});
    w.add<uint8_t>("m", "BOOL", {2}, {1, 0});
    w.data_order = {2, 0, 1};
    const std::string path = w.write("ours.safetensors");
    const std::string script = temp_path("read.py");
    write_text(script, R"(import sys, numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open
t = load_file(sys.argv[1])
assert t["w"].tolist() == [[1, 2], [3, 4]], t["w"]
assert t["s"].dtype == np.int16 and t["s"].tolist() == [-1, 0, 1]
assert t["m"].tolist() == [True, False]
with safe_open(sys.argv[1], "np") as f:
    assert f.metadata() == {"format": "pt"}
)");
    EXPECT_EQ(std::system(("python3 " + script + " " + path).c_str()), 0);
}

// ---------------------------------------------------------------- inspect

TEST(SafetensorsInspect, TextAndJson) {
    const Sharded s = write_sharded("inspect");
    const SafetensorsModel m = SafetensorsModel::open(s.dir);
    const std::string text = safetensors_inspect_text(m);
    for (const char* part : {"model.safetensors.index.json", "2 shards", "model-00002-of-00002.safetensors",
                             "shape as stored, outermost first", "lm_head.weight", "F8_E4M3", "[2, 1]",
                             "4 tensors, 11 parameters", "total_size", "the same in every shard"})
        EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
    const nlohmann::json j = safetensors_inspect_json(m);
    EXPECT_EQ(j["format"], "safetensors");
    EXPECT_EQ(j["files"].size(), 2u);
    EXPECT_EQ(j["files"][0]["metadata"]["format"], "pt");
    EXPECT_EQ(j["index_metadata"]["total_size"], 32);
    ASSERT_EQ(j["tensors"].size(), 4u);
    const auto& lm = j["tensors"][3];
    EXPECT_EQ(lm["name"], "lm_head.weight");
    EXPECT_EQ(lm["dtype"], "F8_E4M3");
    EXPECT_EQ(lm["shape"], nlohmann::json({2, 1}));
    EXPECT_EQ(lm["ne"], nlohmann::json({1, 2}));
    EXPECT_EQ(lm["file"], 1);
    EXPECT_EQ(j["totals"]["parameters"], 11);
    EXPECT_EQ(j["totals"]["bytes"], 32);
    EXPECT_EQ(j["totals"]["by_type"]["F32"]["tensors"], 2);

    // A single file with a rank-5 tensor: no "ne" for it, the shape as stored.
    const std::string one = sample().write("inspect_one.safetensors");
    const nlohmann::json j1 = safetensors_inspect_json(SafetensorsModel::open(one));
    EXPECT_TRUE(j1["index"].is_null());
    EXPECT_EQ(j1["tensors"][0]["name"], "conv");
    EXPECT_FALSE(j1["tensors"][0].contains("ne"));
    EXPECT_EQ(j1["tensors"][0]["shape"], nlohmann::json({1, 2, 1, 1, 2}));
    const std::string t1 = safetensors_inspect_text(SafetensorsModel::open(one));
    EXPECT_NE(t1.find("\"quern test \\\"quoted\\\"\""), std::string::npos) << t1;
    EXPECT_NE(t1.find("format:    safetensors, header"), std::string::npos) << t1;
}

// `quern inspect` on a folder, an index, a file (text and --json), on a bad
// file (exit 1, the error on stderr), and on a GGUF file (unchanged path).
TEST(SafetensorsInspect, Command) {
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    if (!fs::exists(quern)) GTEST_SKIP() << quern << " is not built";
    const Sharded s = write_sharded("cli");
    const auto run = [&](const std::string& args, int* status = nullptr) {
        const std::string out = temp_path("cli.out");
        const int rc = std::system(("'" + quern + "' inspect " + args + " >'" + out + "' 2>&1").c_str());
        if (status) *status = WEXITSTATUS(rc);
        std::ifstream f(out);
        return std::string(std::istreambuf_iterator<char>(f), {});
    };
    int rc = -1;
    std::string out = run("'" + s.dir + "'", &rc);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("2 shards"), std::string::npos) << out;
    EXPECT_NE(out.find("lm_head.weight"), std::string::npos) << out;
    out = run("'" + s.dir + "/model.safetensors.index.json' --json", &rc);
    EXPECT_EQ(rc, 0) << out;
    const nlohmann::json j = nlohmann::json::parse(out);
    EXPECT_EQ(j["totals"]["tensors"], 4);
    out = run("'" + s.dir + "/model-00001-of-00002.safetensors'", &rc);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("embed.weight"), std::string::npos) << out;
    write_bytes(temp_path("cli_bad.safetensors"), raw_file("{\"w\": 1}", {}));
    out = run("'" + temp_path("cli_bad.safetensors") + "'", &rc);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("cli_bad.safetensors': tensor 'w': the entry is"), std::string::npos) << out;
    GgufWriter w;
    const float data[2] = {1, 2};
    w.add_tensor("g", DType::F32, {2, 1, 1, 1}, 1, data);
    w.write(temp_path("cli.gguf"));
    out = run("'" + temp_path("cli.gguf") + "'", &rc);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("GGUF version 3"), std::string::npos) << out;
}

TEST(SafetensorsInspect, Detection) {
    EXPECT_TRUE(looks_like_safetensors(temp_dir().string()));
    EXPECT_TRUE(looks_like_safetensors("whatever.safetensors"));
    EXPECT_TRUE(looks_like_safetensors("model.safetensors.index.json"));
    const std::string noext = temp_path("weights.bin");
    write_bytes(noext, sample().build());
    EXPECT_TRUE(looks_like_safetensors(noext));
    write_bytes(noext, {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0});
    EXPECT_FALSE(looks_like_safetensors(noext));
    EXPECT_FALSE(looks_like_safetensors(temp_path("absent.gguf")));
}

}  // namespace
