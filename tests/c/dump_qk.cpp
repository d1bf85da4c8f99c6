// Dumps the post-RoPE queries and keys ("Qcur-<il>" / "Kcur-<il>" ROPE outputs) and the values ("Vcur-<il>", the
// 3-D tensor the cache stores) of every layer while a model reads a text, for the eviction oracle
// (tests/test_triatt_oracle.py, lab/triatt_hindsight.py, lab/triatt_values.py). Built against the installed libllama.
//
//   dump_qk MODEL TEXT N_TOKENS OUT_DIR
//
// Writes OUT_DIR/q<il>.f32 (n_tok x n_head x head_dim), OUT_DIR/k<il>.f32 and v<il>.f32 (n_tok x n_head_kv x
// head_dim) and OUT_DIR/meta.txt: one line per layer "il n_head n_head_kv head_dim n_rot neox freq_base freq_scale" taken from
// the ROPE ops themselves.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

namespace {

struct capture {
    std::map<std::string, std::vector<float>> data;  // "q12" -> rows
    std::map<int, std::string> meta;                 // il -> line
};

bool is_target(const ggml_tensor * t) {
    if (t->type != GGML_TYPE_F32) {
        return false;
    }
    if (std::strncmp(t->name, "Vcur-", 5) == 0) { // the head-split values (the 2-D projection is named alike)
        return ggml_n_dims(t) == 3 && ggml_is_contiguous(t);
    }
    return t->op == GGML_OP_ROPE && (std::strncmp(t->name, "Qcur-", 5) == 0 || std::strncmp(t->name, "Kcur-", 5) == 0);
}

bool cb(ggml_tensor * t, bool ask, void * ud) {
    if (ask) {
        return is_target(t);
    }
    if (!is_target(t)) {
        return true;
    }
    auto * c = static_cast<capture *>(ud);
    const char kind = t->name[0]; // Q, K or V
    const bool q = kind == 'Q';
    const int il = std::atoi(t->name + 5);
    std::vector<float> buf(ggml_nelements(t));
    ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
    auto & dst = c->data[std::string(1, (char) (kind + 'a' - 'A')) + std::to_string(il)];
    dst.insert(dst.end(), buf.begin(), buf.end());
    if (q && !c->meta.count(il)) {
        const int32_t * op = (const int32_t *) t->op_params;
        float base, scale;
        std::memcpy(&base, op + 5, sizeof base);
        std::memcpy(&scale, op + 6, sizeof scale);
        std::ostringstream line;
        line << il << " " << t->ne[1] << " ";
        c->meta[il] = line.str() + "? " + std::to_string(t->ne[0]) + " " + std::to_string(op[1]) + " " +
                      std::to_string((op[2] & GGML_ROPE_TYPE_NEOX) ? 1 : 0) + " " + std::to_string(base) + " " +
                      std::to_string(scale);
    }
    if (kind == 'K') {  // fill in n_head_kv
        auto it = c->meta.find(il);
        if (it != c->meta.end()) {
            const auto p = it->second.find('?');
            if (p != std::string::npos) {
                it->second.replace(p, 1, std::to_string(t->ne[1]));
            }
        }
    }
    return true;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s MODEL TEXT N_TOKENS OUT_DIR\n", argv[0]);
        return 2;
    }
    const int n_tok = std::atoi(argv[3]);
    const std::string out = argv[4];
    std::ifstream f(argv[2]);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();

    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        std::fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> toks(text.size() + 8);
    const int n = llama_tokenize(vocab, text.c_str(), (int) text.size(), toks.data(), (int) toks.size(), true, false);
    if (n < n_tok) {
        std::fprintf(stderr, "text has only %d tokens\n", n);
        return 1;
    }
    toks.resize(n_tok);

    capture cap;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_tok;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.cb_eval = cb;
    cp.cb_eval_user_data = &cap;
    llama_context * ctx = llama_init_from_model(model, cp);
    for (int i = 0; i < n_tok; i += 512) {
        const int m = std::min(512, n_tok - i);
        if (llama_decode(ctx, llama_batch_get_one(toks.data() + i, m)) != 0) {
            std::fprintf(stderr, "decode failed\n");
            return 1;
        }
    }
    std::ofstream meta(out + "/meta.txt");
    for (const auto & [il, line] : cap.meta) {
        meta << line << "\n";
    }
    for (const auto & [name, rows] : cap.data) {
        std::ofstream bin(out + "/" + name + ".f32", std::ios::binary);
        bin.write(reinterpret_cast<const char *>(rows.data()), (std::streamsize) (rows.size() * sizeof(float)));
    }
    std::printf("dumped %d tokens, %zu layers\n", n_tok, cap.meta.size());
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
