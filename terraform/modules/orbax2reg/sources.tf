# What the module builds from: the repository it is part of (path.module/../../.., a clone at a release tag or the
# module's git source, which terraform downloads whole), as two archives (build.tf) named by what is in them.
# Locals only, from functions on local files (no resource, data source or provider), so a test can evaluate them
# offline as it evaluates main.tf.
#
# The identity of each archive is a SHA-256 over the sorted file names and each file's SHA-256 (plus the generated
# package.json and the image's base), not over the zip's bytes: a code change is a new name, hence a redeploy, and
# nothing else is (not a new terraform, provider or zip library).

locals {
  repository_root = "${path.module}/../../.."

  # The jobs' image: the Dockerfile's build context, exactly the files .dockerignore lets in (package.json and the
  # lockfile, the TypeScript configuration, src/, jobs/, bin/, the scripts the build runs, and build-info.json where
  # the tree has one: a release's source archive does, naming its commit for `orbax2reg --version`) and the Dockerfile.
  image_source_files = sort(concat(
    ["Dockerfile", "package.json", "package-lock.json", "tsconfig.json", "tsconfig.build.json", "scripts/image-deps.mjs", "scripts/build-info.mjs"],
    tolist(fileset(local.repository_root, "{src,jobs,bin,assets}/**")),
    fileexists("${local.repository_root}/build-info.json") ? ["build-info.json"] : [],
  ))
  image_source_id = sha256(join("", concat(
    [for f in local.image_source_files : "${f} ${filesha256("${local.repository_root}/${f}")}\n"],
    ["NODE_IMAGE ${var.image_build_node_image}\n"],
  )))
  # The tag the build pushes and the jobs run: 16 hex digits (64 bits) of the identity.
  image_tag = substr(local.image_source_id, 0, 16)

  # The function: its TypeScript, compiled by Cloud Functions' own build (Google's Node.js buildpack runs the
  # `gcp-build` script with devDependencies installed, then prunes them: https://cloud.google.com/run/docs/runtimes/nodejs,
  # "NPM build scripts"; https://cloud.google.com/appengine/docs/standard/nodejs/running-custom-build-step), from a
  # lockfile (`npm ci`: the tested versions). Its package.json and lockfile are functions/'s, at the archive's root:
  # only the packages functions/index.ts loads, cut from the repository's lockfile (same versions), so the build
  # installs no zstd addon, whose install script would fetch a prebuilt binary from GitHub (else node-gyp the headers
  # from nodejs.org): a build that may not reach the internet, or an organization that requires builds in a worker
  # pool (https://cloud.google.com/functions/docs/securing/custom-constraints), refuses that. functions/tsconfig.json
  # compiles the function and what it imports, nothing else of src/.
  function_source_files = sort(concat(
    ["tsconfig.json", "functions/tsconfig.json"],
    tolist(fileset(local.repository_root, "src/**")),
    tolist(fileset(local.repository_root, "functions/*.ts")),
  ))
  function_package_json = file("${local.repository_root}/functions/package.json")
  function_package_lock = file("${local.repository_root}/functions/package-lock.json")
  function_npmrc        = var.npm_registry == null ? null : "registry=${var.npm_registry}\n"
  function_source_id = sha256(join("", concat(
    [for f in local.function_source_files : "${f} ${filesha256("${local.repository_root}/${f}")}\n"],
    ["package.json ${sha256(local.function_package_json)}\n", "package-lock.json ${sha256(local.function_package_lock)}\n"],
    local.function_npmrc == null ? [] : [".npmrc ${sha256(local.function_npmrc)}\n"],
  )))
  function_source_object_name = "orbax2reg/function-${substr(local.function_source_id, 0, 16)}.zip"
}
