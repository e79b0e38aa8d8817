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
  # "NPM build scripts"; https://cloud.google.com/appengine/docs/standard/nodejs/running-custom-build-step), from the
  # lockfile (`npm ci`: the tested versions). tsconfig.build.json compiles src/, jobs/ and functions/.
  function_source_files = sort(concat(
    ["package-lock.json", "tsconfig.json", "tsconfig.build.json"],
    tolist(fileset(local.repository_root, "{src,jobs,functions}/**")),
  ))
  repository_package = jsondecode(file("${local.repository_root}/package.json"))
  # The repository's package.json with `main` naming the function's module (the Functions Framework loads it) and
  # `gcp-build` as its only script: no `prepare` (npm would run it at every install, also after the prune, without
  # TypeScript), no `build` (the buildpack would run that too). The dependencies stay exactly the lockfile's.
  function_package_json = jsonencode(merge(
    { for k, v in local.repository_package : k => v if !contains(["bin", "files", "scripts"], k) },
    {
      main    = "dist/functions/index.js"
      scripts = { "gcp-build" = "tsc -p tsconfig.build.json --sourceMap false --declaration false --incremental false" }
    },
  ))
  function_source_id = sha256(join("", concat(
    [for f in local.function_source_files : "${f} ${filesha256("${local.repository_root}/${f}")}\n"],
    ["package.json ${sha256(local.function_package_json)}\n"],
  )))
  function_source_object_name = "orbax2reg/function-${substr(local.function_source_id, 0, 16)}.zip"
}
